//! Image cache: owns the read-only root filesystems that container sandboxes use as
//! their overlay lower layer. Images are built from recipes (`rootfs/images/*.sh`,
//! embedded in the binary, plus optional extra recipe directories), addressed by the
//! sha256 of the recipe text, built at most once per digest, and stored with every
//! owner shifted into the sandbox user namespace's host range.
//!
//! Layout under `images_dir`:
//! ```text
//! sha256-<hex>/rootfs      the image (present only when complete)
//! sha256-<hex>/lock        flock held while building that digest
//! sha256-<hex>/recipe.sh   the recipe text the image was built from
//! sha256-<hex>/meta.json   name, digest, size, build time
//! by-name/<name>           symlink to the digest dir last built for a name
//! logs/<name>.log          output of the last build of <name>
//! trash/                   trees replaced by a forced rebuild (see `build`)
//! ```
//!
//! [`ImageCache::prune`] removes trees no recipe names any more and trash
//! that nothing stacks on.

mod build;
pub mod built;
mod cache;
mod error;
pub mod ext4;
pub mod flatten;
pub mod host_ext4;
pub mod layered;
pub mod lowerdir;
pub(crate) mod mounts;
mod name;
pub mod oci;
mod progress;
mod prune;
mod recipe;
mod shift;
mod usage;

#[cfg(test)]
mod tests;

pub use cache::{Image, ImageCache, ImageDefaults, ImageInfo};
pub use error::ImageError;
pub use layered::Layered;
pub use name::validate_name;
pub use progress::{report, CountingWriter, Progress, ProgressSink};
pub use prune::{mounted_lower_layers, PruneReport};
pub use recipe::FORMAT_VERSION;
pub use shift::{ID_OFFSET, ID_RANGE};
pub use usage::{last_use, touch, tree_bytes};
