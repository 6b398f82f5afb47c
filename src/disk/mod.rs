//! Per-sandbox disk: owns the btrfs pool that holds every sandbox's writable layer
//! (overlay `upper/` + `work/`), one subvolume per sandbox with a qgroup limit, so a
//! sandbox that fills its disk gets EDQUOT and the host disk is untouched.
//!
//! Snapshots of layers (read-only btrfs snapshots, sharing extents) live in
//! the same pool, under `snapshots/`.
//!
//! Setting the pool up (mkfs, loop mount, quota enable) uses the btrfs CLI once per
//! boot; creating and removing layers is ioctls only, since it is on the sandbox
//! create/delete path.

mod error;
mod file_version;
mod ioctl;
mod layer;
mod pool;
mod snapshot;

#[cfg(test)]
mod tests;

pub use error::DiskError;
pub use file_version::FileVersion;
pub use layer::{limit_layer_at, validate_id};
pub use pool::DiskPool;
pub use snapshot::free_bytes_at;

/// Default per-sandbox limit.
pub const DEFAULT_LIMIT_BYTES: u64 = 10 << 30;
