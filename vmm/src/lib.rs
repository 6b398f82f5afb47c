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
//! - [`cmdline`]: the command line a Linux guest gets.
//!
//! What is not here yet: virtio-net and virtio-rng, ACPI, seccomp, whole-VM
//! snapshots (device and vCPU state are serialisable already); see
//! vmm/README.md.

#![warn(missing_docs)]

pub mod arch;
pub mod builder;
pub mod cmdline;
pub mod config;
pub mod devices;
pub mod loader;
pub mod machine;
pub mod stop;
pub mod vstate;

pub use builder::{build, BuildError};
pub use config::{ConfigError, VmConfig};
pub use machine::{GuestExit, Machine, RunError, RunReport};
