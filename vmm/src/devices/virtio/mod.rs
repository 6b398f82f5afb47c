//! virtio devices on the virtio-mmio transport (virtio 1.x, "modern", MMIO
//! version 2), laid out as Firecracker's are: [`mmio`] is the transport (the
//! register file a vCPU's MMIO exits land in), [`queue`] the bounded helpers
//! around rust-vmm's `virtio-queue`, [`worker`] the per-device thread that
//! processes queues, and one directory per device ([`block`], [`net`], [`vsock`]), each
//! with a `persist.rs` holding its serde state.
//!
//! Division of work: the transport owns configuration (features, queue
//! addresses, status) and runs on vCPU threads; once the driver sets
//! DRIVER_OK it hands the device a [`DeviceContext`] and the device starts a
//! worker thread that owns all queue processing. A queue notification is an
//! eventfd the worker waits on: KVM signals it directly when the VMM could
//! register an ioeventfd for the QueueNotify register, otherwise the
//! transport does on the MMIO exit. Interrupts go out through an irqfd.

pub mod block;
pub mod mmio;
pub mod net;
pub mod persist;
pub mod queue;
pub mod vsock;
pub mod worker;

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
pub use virtio_bindings::virtio_ids::{VIRTIO_ID_BLOCK, VIRTIO_ID_VSOCK};

/// Device status bits (virtio 1.x section 2.1).
pub mod status {
    pub use virtio_bindings::virtio_config::{
        VIRTIO_CONFIG_S_ACKNOWLEDGE as ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER as DRIVER,
        VIRTIO_CONFIG_S_DRIVER_OK as DRIVER_OK, VIRTIO_CONFIG_S_FAILED as FAILED,
        VIRTIO_CONFIG_S_FEATURES_OK as FEATURES_OK,
        VIRTIO_CONFIG_S_NEEDS_RESET as DEVICE_NEEDS_RESET,
    };
}

/// InterruptStatus bit: a used ring was updated.
pub const INTERRUPT_USED_RING: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_VRING;
/// InterruptStatus bit: the configuration space changed.
pub const INTERRUPT_CONFIG: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_CONFIG;

/// Locks `m` even if a thread panicked while holding it: device state is only
/// ever mutated in place with no multi-step invariants spanning a panic, and
/// the panicking thread has already stopped (and reported) its work.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A device's interrupt line: the InterruptStatus register, shared between the
/// transport (which the driver reads and acknowledges) and the device's worker
/// (which raises it), plus the eventfd registered as an irqfd on the device's
/// GSI.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    evt: EventFd,
}

impl Interrupt {
    /// A line with nothing pending, on a new eventfd.
    pub fn new() -> io::Result<Self> {
        Ok(Interrupt {
            status: AtomicU32::new(0),
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// Marks `bits` pending and raises the line. The status is set first so a
    /// driver woken by the interrupt always sees why.
    pub fn trigger(&self, bits: u32) -> io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.evt.write(1)
    }

    /// The InterruptStatus register.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// InterruptACK: clears `bits`.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Sets the register outright (restore, reset).
    pub fn set_status(&self, value: u32) {
        self.status.store(value, Ordering::SeqCst);
    }

    /// The eventfd, to register with `Vm::register_irqfd`.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

/// What a device gets when the driver sets DRIVER_OK.
#[derive(Clone, Debug)]
pub struct DeviceContext {
    /// Guest memory, for the queues and the buffers they point at.
    pub mem: GuestMemoryMmap,
    /// The device's queues, shared with the transport so that their state
    /// can be saved while the device runs (the worker holds the lock only
    /// while it processes a batch).
    pub queues: Arc<Mutex<Vec<Queue>>>,
    /// The device's interrupt line.
    pub interrupt: Arc<Interrupt>,
    /// The features the driver accepted.
    pub acked_features: u64,
}

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up fewer queues than the device needs.
    #[error("the driver made {found} virtqueues ready, the device needs {needed}")]
    QueuesNotReady {
        /// Queues needed.
        needed: usize,
        /// Queues ready.
        found: usize,
    },
    /// The worker thread could not be set up.
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// The device was activated twice without a reset.
    #[error("the device is already active; the driver must reset it first")]
    AlreadyActive,
    /// An earlier worker thread died and took the device's backend (disk,
    /// sockets) with it.
    #[error("the {0} device lost its backend when its worker thread failed; restart the VM")]
    Broken(&'static str),
}

/// A virtio device behind a virtio-mmio transport.
pub trait VirtioDevice: Send {
    /// The virtio device ID (net 1, block 2, vsock 19, ...).
    fn device_type(&self) -> u32;
    /// The largest size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits the device offers.
    fn avail_features(&self) -> u64;
    /// Reads the device-specific configuration space; bytes past its end
    /// read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the configuration space. The devices here have no writable
    /// fields, so the default ignores the write.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// One eventfd per queue: signalled on QueueNotify for that queue.
    fn queue_events(&self) -> &[EventFd];
    /// Starts processing (the driver set DRIVER_OK).
    fn activate(&mut self, ctx: DeviceContext) -> Result<(), ActivateError>;
    /// Whether the device is processing queues.
    fn is_activated(&self) -> bool;
    /// Stops processing (the driver wrote 0 to Status), so that a new
    /// activation starts from a clean device.
    fn reset(&mut self);
    /// The device's own saved state (the transport saves the queues).
    fn device_state(&self) -> persist::DeviceState;
    /// Stops the worker (if running) between two batches and keeps its
    /// running state, so that guest memory and queues stay still while the
    /// VM is paused (snapshots). Queue notifies wait in their eventfds.
    fn pause(&mut self) -> Result<(), ActivateError> {
        Ok(())
    }
    /// Restarts a worker stopped by [`pause`](Self::pause) with the same
    /// running state (connections, disk).
    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(())
    }
    /// The device as a block device, if it is one (slots change media).
    fn as_block(&self) -> Option<&block::Block> {
        None
    }
    /// The same, to change a slot's medium.
    fn as_block_mut(&mut self) -> Option<&mut block::Block> {
        None
    }
}

/// Copies the part of `config` at `offset` into `data`; bytes past its end
/// read as zero, so any access a driver makes gets an answer.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(start..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}

/// The kernel command-line word that tells a Linux guest about one
/// virtio-mmio device (there is no ACPI or device tree here):
/// `virtio_mmio.device=4K@0xADDR:IRQ`, parsed by Linux's virtio_mmio driver
/// when it is built in (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES).
pub fn linux_cmdline_device(base: u64, size: u64, gsi: u32) -> String {
    let size = if size % 1024 == 0 {
        format!("{}K", size / 1024)
    } else {
        size.to_string()
    };
    format!("virtio_mmio.device={size}@{base:#x}:{gsi}")
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_linux_cmdline_form() {
        assert_eq!(
            linux_cmdline_device(0xd000_0000, 0x1000, 5),
            "virtio_mmio.device=4K@0xd0000000:5"
        );
        assert_eq!(
            linux_cmdline_device(0x1234, 100, 23),
            "virtio_mmio.device=100@0x1234:23"
        );
    }

    #[test]
    fn interrupt_status_is_set_before_the_line_and_acked_by_bit() {
        let irq = Interrupt::new().expect("eventfd");
        irq.trigger(INTERRUPT_USED_RING).expect("trigger");
        irq.trigger(INTERRUPT_CONFIG).expect("trigger");
        assert_eq!(irq.status(), INTERRUPT_USED_RING | INTERRUPT_CONFIG);
        assert_eq!(irq.eventfd().read().expect("raised"), 2);
        irq.ack(INTERRUPT_USED_RING);
        assert_eq!(irq.status(), INTERRUPT_CONFIG);
    }
}
