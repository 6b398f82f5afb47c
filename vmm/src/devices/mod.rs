//! Emulated devices and the buses that route guest port and MMIO accesses to
//! them. For now: the 16550 serial console, the i8042 (reset only) and the
//! exit port, and the virtio-mmio devices (block, vsock) on the MMIO bus.

pub mod bus;
pub mod exit;
pub mod i8042;
pub mod serial;
pub mod virtio;
