//! Built images on disk, under `<pool>/built` (the btrfs pool, so a build's
//! layer is kept as a read-only snapshot of its build sandbox's layer, with
//! no copy):
//!
//! ```text
//! <hex>/layer/upper    what the build wrote: the image's top overlay lower
//! <hex>/meta.json      the spec, its base, defaults, size, build time
//! <hex>/build.log      the build's output
//! <hex>/used           its mtime is the image's last use
//! .partial-<hex>/      a build being kept (removed when found on open)
//! ```
//!
//! The btrfs work (snapshot, subvolume removal) is the caller's: this
//! module only names and records.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::spec::ImageSpec;
use crate::image::{Image, ImageDefaults};

const META: &str = "meta.json";
const USED: &str = "used";
const PARTIAL: &str = ".partial-";
/// What a built image is called where a name is wanted (`built-<hex>`).
const NAME_PREFIX: &str = "built-";

/// One built image, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuiltImage {
    /// `sha256:<hex>` of the spec, its base and its package sources.
    pub digest: String,
    /// The name creates and sandboxes show for it (`built-<hex>`).
    pub name: String,
    pub spec: ImageSpec,
    /// The base as the spec named it, and the digest it resolved to.
    pub base: String,
    pub base_digest: String,
    /// Bytes the build added (its layer).
    pub size_bytes: u64,
    pub build_seconds: f64,
    pub built_at: String,
    /// When a create last used it; filled in by [`BuiltStore::list`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
}

impl BuiltImage {
    /// The image a create stacks: the build's layer over the base's.
    pub fn image(&self, store: &BuiltStore, base: &Image) -> Image {
        let mut layers = vec![store.upper(self)];
        layers.extend(base.layers.iter().cloned());
        let mut env = base.defaults.env.clone();
        for (key, value) in &self.spec.env {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        Image {
            name: self.name.clone(),
            digest: self.digest.clone(),
            rootfs: base.rootfs.clone(),
            layers,
            defaults: ImageDefaults {
                env,
                working_dir: self
                    .spec
                    .workdir
                    .clone()
                    .or_else(|| base.defaults.working_dir.clone()),
                user: base.defaults.user.clone(),
            },
        }
    }
}

/// `built-<hex>` for a build address.
pub fn name_of(hex: &str) -> String {
    format!("{NAME_PREFIX}{hex}")
}

/// The build address a `built-<hex>` name holds.
pub fn hex_of_name(name: &str) -> Option<&str> {
    let hex = name.strip_prefix(NAME_PREFIX)?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

#[derive(Debug)]
pub struct BuiltStore {
    dir: PathBuf,
}

impl BuiltStore {
    /// The store under `dir` (`<pool>/built`).
    pub fn new(dir: PathBuf) -> Self {
        BuiltStore { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of the image with build address `hex`.
    pub fn image_dir(&self, hex: &str) -> PathBuf {
        self.dir.join(hex)
    }

    /// Where a build of `hex` is put together before it is renamed in.
    pub fn partial_dir(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("{PARTIAL}{hex}"))
    }

    /// Leftovers of builds a crash interrupted.
    pub fn partials(&self) -> Vec<PathBuf> {
        fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(PARTIAL))
            .map(|e| e.path())
            .collect()
    }

    pub fn upper(&self, image: &BuiltImage) -> PathBuf {
        let hex = image.digest.trim_start_matches("sha256:");
        self.image_dir(hex).join("layer").join("upper")
    }

    /// The image with build address `hex`, if built.
    pub fn get(&self, hex: &str) -> Option<BuiltImage> {
        let text = fs::read(self.image_dir(hex).join(META)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Notes a use now (a create stacking it).
    pub fn touch(&self, hex: &str) {
        crate::image::touch(&self.image_dir(hex).join(USED));
    }

    /// Every built image, with its last use.
    pub fn list(&self) -> Vec<BuiltImage> {
        let mut out: Vec<BuiltImage> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let mut image = self.get(&name)?;
                image.last_used_at = crate::image::last_use(&e.path().join(USED));
                Some(image)
            })
            .collect();
        out.sort_by(|a, b| a.built_at.cmp(&b.built_at));
        out
    }

    /// Writes `image`'s meta into the partial directory `partial`, then
    /// renames that into place: the image appears whole or not at all.
    pub fn commit(&self, partial: &Path, image: &BuiltImage) -> std::io::Result<()> {
        let hex = image.digest.trim_start_matches("sha256:");
        let bytes = serde_json::to_vec_pretty(image).map_err(std::io::Error::other)?;
        fs::write(partial.join(META), bytes)?;
        fs::rename(partial, self.image_dir(hex))?;
        self.touch(hex);
        Ok(())
    }
}
