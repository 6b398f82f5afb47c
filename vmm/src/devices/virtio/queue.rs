//! Queue handling on top of rust-vmm's `virtio-queue`: popping descriptor
//! chains and returning them, with every guest-controlled quantity bounded.
//!
//! What `virtio-queue` already guarantees, and the devices rely on: a chain
//! yields at most `queue size` descriptors (or the indirect table's length,
//! itself at most 65535 entries), its total length fits in a u32, an
//! available index more than a queue size ahead is refused, and every guest
//! address is checked against guest memory when it is read or written. What
//! the devices add: their own limits on request and packet sizes, and an
//! answer (an error status, an RST, or a used entry of length 0) for
//! malformed chains instead of a panic or a stuck queue.

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;

/// Largest queue the devices here offer (Firecracker's size too).
pub const QUEUE_MAX_SIZE: u16 = 256;

/// A chain popped from a queue, borrowing guest memory.
pub type Chain<'a> = DescriptorChain<&'a GuestMemoryMmap>;

/// Failures returning a chain to the driver.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The used ring could not be written: the driver put it outside RAM
    /// after all, or the head index is out of range (a vmm bug).
    #[error("cannot write the used ring: {0}")]
    Used(#[source] virtio_queue::Error),
    /// The available ring could not be read.
    #[error("cannot read the available ring: {0}")]
    Avail(#[source] virtio_queue::Error),
}

/// Pops the next available chain, or `None` when the ring is empty. A ring
/// the device cannot read (not ready, an available index more than a queue's
/// worth ahead) is an error; devices treat it as empty: the driver broke the
/// queue and gets no answer on it until it resets the device. A chain head
/// that cannot be read (outside RAM) also ends the pass.
///
/// A head index beyond the queue size names no descriptor and cannot be
/// returned through the used ring (virtio-queue refuses it), so such entries
/// are skipped.
pub fn pop<'a>(
    queue: &mut Queue,
    mem: &'a GuestMemoryMmap,
) -> Result<Option<Chain<'a>>, QueueError> {
    let size = queue.size();
    let mut iter = queue.iter(mem).map_err(QueueError::Avail)?;
    // Bounded: the iterator yields at most one queue's worth of entries.
    for chain in iter.by_ref() {
        if chain.head_index() < size {
            return Ok(Some(chain));
        }
    }
    Ok(None)
}

/// Puts a chain back at the front of the available ring (the device could
/// not use it yet, e.g. a vsock RX buffer with nothing to send).
pub fn undo_pop(queue: &mut Queue) {
    queue.go_to_previous_position();
}

/// Returns chain `head` to the driver with `len` bytes written into it.
pub fn add_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    head: u16,
    len: u32,
) -> Result<(), QueueError> {
    queue.add_used(mem, head, len).map_err(QueueError::Used)
}

/// Whether the driver set up the queue where the device can use it.
pub fn is_usable(queue: &Queue, mem: &GuestMemoryMmap) -> bool {
    queue.is_valid(mem)
}
