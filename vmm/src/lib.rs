//! sandboxd's microVM monitor: one process per VM, built on KVM with the
//! rust-vmm crates (kvm-ioctls, vm-memory, linux-loader, vm-superio).
//!
//! Layout, one module per concern:
//! - [`config`]: what a VM is asked to be, and the checks that need no KVM;
//! - [`builder`]: turning a config into a ready [`Machine`];
//! - [`machine`]: running it (a thread per vCPU) to a [`RunReport`];
//! - [`stop`]: how the first stop reason is recorded and waited for;
//! - [`vstate`]: KVM handle, guest memory, VM, vCPUs and their saved state;
//! - [`arch`]: the x86_64 memory map and 64-bit boot state;
//! - [`devices`]: port/MMIO buses, serial console, i8042, exit port, and the
//!   virtio-mmio devices (block, vsock);
//! - [`loader`]: loading the kernel (ELF or bzImage) and the initramfs, and
//!   choosing the boot protocol from the image;
//! - [`cmdline`]: the command line a Linux guest gets;
//! - [`control`], [`handle`], [`snapshot`]: pausing, snapshotting and
//!   restoring a running VM;
//! - [`jail`], [`seccomp`]: what the binary drops before the guest runs.
//!
//! What is not here yet: virtio-net and virtio-rng, ACPI; see vmm/README.md.

#![warn(missing_docs)]

pub mod arch;
pub mod builder;
pub mod cmdline;
pub mod config;
pub mod control;
pub mod devices;
pub mod handle;
pub mod jail;
pub mod loader;
pub mod machine;
pub mod seccomp;
pub mod snapshot;
pub mod stop;
pub mod vstate;

pub use builder::{build, BuildError};
pub use config::{ConfigError, VmConfig};
pub use handle::MachineHandle;
pub use machine::{GuestExit, Machine, RunError, RunReport};
