//! What a sandbox's limits may be, named once for the daemon, which
//! checks a create against them, and for the containerd shim, which fits
//! what a spec asks into them.

use std::ops::RangeInclusive;

/// A CPU weight in cgroup v1 shares, as the kernel takes it (v2's
/// `cpu.weight` is derived from it).
pub const CPU_SHARES: RangeInclusive<u64> = 2..=262_144;

/// The weight a group has unless told otherwise (v2's `cpu.weight` 100).
pub const DEFAULT_CPU_SHARES: u64 = 1024;
