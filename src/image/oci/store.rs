//! The pulled images on disk, under `<images_dir>/oci`:
//!
//! ```text
//! layers/<hex>/        one unpacked layer per blob digest, shared by every
//!                      image that has it; present only when complete
//! images/<hex>.json    one image per manifest digest: its layers (bottom
//!                      first), config defaults, size, reference
//! refs/<hex>           manifest digest a reference (tag) last resolved to,
//!                      named by the sha256 of the reference
//! tmp/                 downloads and unpacks under way (emptied on open)
//! ```
//!
//! A create stacks `layers/` directories as overlay lowers, so nothing is
//! copied per sandbox.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::RegistryError;
use crate::image::{Image, ImageDefaults};

/// The most layers an image may have: Docker builds at most 127, and 128
/// spelled as descriptors (`image/lowerdir.rs`) fit the overlay's one page
/// of mount options beside the upper and work paths.
pub const MAX_LAYERS: usize = 128;

/// One pulled image, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PulledImage {
    /// Canonical references it was pulled by (`docker.io/library/node:20`);
    /// several tags may name one manifest.
    pub references: Vec<String>,
    /// `sha256:<hex>` of its (linux/amd64) manifest.
    pub digest: String,
    pub config_digest: String,
    /// Layer blob digests, bottom first.
    pub layers: Vec<String>,
    /// Bytes of the unpacked layers (shared ones counted in each image).
    pub size_bytes: u64,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    pub pulled_at_unix: u64,
    /// When a create last used it (listings only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
    /// How many of its layers other pulled images share (listings only;
    /// stored once).
    #[serde(default)]
    pub shared_layers: usize,
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

pub fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then_some(hex)
}

impl Store {
    pub fn new(dir: PathBuf) -> Self {
        Store { dir }
    }

    /// Makes the directories and empties `tmp/` (what a crash left half done).
    pub fn open(&self) -> Result<(), RegistryError> {
        for sub in ["layers", "images", "refs"] {
            let path = self.dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| RegistryError::io("create", &path, e))?;
        }
        let tmp = self.tmp_dir();
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| RegistryError::io("clear", &tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| RegistryError::io("create", &tmp, e))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    pub fn layer_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("layers").join(hex)
    }

    pub(super) fn image_file(&self, hex: &str) -> PathBuf {
        self.dir.join("images").join(format!("{hex}.json"))
    }

    /// Its mtime is the image's last use.
    pub(super) fn used_file(&self, hex: &str) -> PathBuf {
        self.dir.join("images").join(format!("{hex}.used"))
    }

    /// Notes a use of the image with manifest digest `digest` now.
    pub fn touch(&self, digest: &str) {
        if let Some(hex) = hex_of(digest) {
            crate::image::touch(&self.used_file(hex));
        }
    }

    /// The image recorded under manifest digest `digest`.
    pub fn by_digest(&self, digest: &str) -> Option<PulledImage> {
        let hex = hex_of(digest)?;
        let bytes = std::fs::read(self.image_file(hex)).ok()?;
        let image: PulledImage = serde_json::from_slice(&bytes).ok()?;
        // Every layer must still be there (a prune may have raced).
        image
            .layers
            .iter()
            .all(|l| hex_of(l).is_some_and(|h| self.layer_dir(h).is_dir()))
            .then_some(image)
    }

    /// The image `reference` last resolved to, if it is still stored.
    pub fn by_reference(&self, reference: &str) -> Option<PulledImage> {
        let digest = std::fs::read_to_string(self.ref_file(reference)).ok()?;
        self.by_digest(digest.trim())
    }

    /// Records `image` as pulled by `reference` (kept beside the references
    /// it already had) and points that reference at it.
    pub fn save(&self, image: &PulledImage, reference: &str) -> Result<PulledImage, RegistryError> {
        let hex = hex_of(&image.digest).ok_or_else(|| RegistryError::Malformed {
            reference: reference.to_string(),
            detail: format!("manifest digest {} is not sha256", image.digest),
        })?;
        let mut image = image.clone();
        if let Some(known) = std::fs::read(self.image_file(hex))
            .ok()
            .and_then(|b| serde_json::from_slice::<PulledImage>(&b).ok())
        {
            image.references.extend(known.references);
        }
        image.references.push(reference.to_string());
        image.references.sort();
        image.references.dedup();
        let json = serde_json::to_vec_pretty(&image).map_err(|e| {
            RegistryError::io("encode", self.image_file(hex), std::io::Error::other(e))
        })?;
        write_atomic(&self.image_file(hex), &json, &self.tmp_dir())?;
        write_atomic(
            &self.ref_file(reference),
            image.digest.as_bytes(),
            &self.tmp_dir(),
        )?;
        Ok(image)
    }

    /// Every recorded image.
    pub fn list(&self) -> Vec<PulledImage> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("images")) else {
            return Vec::new();
        };
        let mut images: Vec<PulledImage> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<PulledImage>(&b).ok())
            .map(|mut image| {
                image.last_used_at =
                    hex_of(&image.digest).and_then(|h| crate::image::last_use(&self.used_file(h)));
                image
            })
            .collect();
        images.sort_by(|a: &PulledImage, b| a.references.cmp(&b.references));
        let mut holders: std::collections::HashMap<String, usize> = Default::default();
        for layer in images.iter().flat_map(|i| &i.layers) {
            *holders.entry(layer.clone()).or_default() += 1;
        }
        for image in &mut images {
            image.shared_layers = image
                .layers
                .iter()
                .filter(|l| holders.get(*l).is_some_and(|n| *n > 1))
                .count();
        }
        images
    }

    /// The image as the runtimes stack it, named `reference`: the bottom
    /// layer as the root, the others above it, top first.
    pub fn image(&self, pulled: &PulledImage, reference: &str) -> Result<Image, RegistryError> {
        let dirs: Vec<PathBuf> = pulled
            .layers
            .iter()
            .map(|l| {
                hex_of(l)
                    .map(|h| self.layer_dir(h))
                    .ok_or_else(|| RegistryError::Malformed {
                        reference: reference.to_string(),
                        detail: format!("layer digest {l} is not sha256"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let (bottom, above) = dirs.split_first().ok_or_else(|| RegistryError::Malformed {
            reference: reference.to_string(),
            detail: "the manifest lists no layers".into(),
        })?;
        Ok(Image {
            name: reference.to_string(),
            digest: pulled.digest.clone(),
            rootfs: bottom.clone(),
            layers: above.iter().rev().cloned().collect(),
            defaults: ImageDefaults {
                env: pulled
                    .env
                    .iter()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                working_dir: pulled.working_dir.clone().filter(|w| w.starts_with('/')),
                user: pulled.user.clone().filter(|u| !u.is_empty()),
            },
        })
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn write_atomic(path: &Path, bytes: &[u8], tmp_dir: &Path) -> Result<(), RegistryError> {
    let tmp = tmp_dir.join(format!("write-{}", hex::encode(rand::random::<[u8; 8]>())));
    std::fs::write(&tmp, bytes).map_err(|e| RegistryError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| RegistryError::io("rename into place", path, e))
}
