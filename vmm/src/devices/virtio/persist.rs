//! Saved state shared by every virtio device: the virtqueues and the
//! transport's registers. Each device's own state lives in its directory's
//! `persist.rs`. Every state type carries a version and is checked on
//! restore, because a snapshot outlives the VMM build that wrote it.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState};

/// A device's own saved state, by kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceState {
    /// virtio-blk.
    Block(super::block::BlockState),
    /// virtio-vsock.
    Vsock(super::vsock::VsockState),
    /// virtio-net.
    Net(super::net::NetState),
}

/// Everything saved for one virtio-mmio device: the transport (registers and
/// queues) and the device's own state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioMmioState {
    /// Registers and queues.
    pub transport: super::mmio::MmioTransportState,
    /// The device.
    pub device: DeviceState,
}

/// Why saved virtio state could not be restored. Each message says what the
/// state or the VM configuration got wrong.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The state was written by an incompatible VMM build.
    #[error("saved {what} state has version {found}, this vmm reads version {expected}")]
    Version {
        /// Which state.
        what: &'static str,
        /// Version in the state.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// A saved queue is not one a driver could have set up.
    #[error("saved virtqueue {index} is invalid ({source}); the snapshot is corrupt")]
    Queue {
        /// The queue.
        index: usize,
        /// What virtio-queue found wrong.
        #[source]
        source: virtio_queue::Error,
    },
    /// The state does not match the device it is restored into.
    #[error("saved state does not match this device: {0}")]
    Mismatch(String),
    /// The device could not be restarted.
    #[error("cannot restart the restored device: {0}")]
    Activate(#[from] super::ActivateError),
    /// A device-specific resource (disk, socket) could not be set up again.
    #[error("cannot restore the device: {0}")]
    Device(String),
}

/// One virtqueue, as `virtio_queue::QueueState` but serialisable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedQueue {
    /// The largest size the device offers.
    pub max_size: u16,
    /// Next available-ring entry the device will read.
    pub next_avail: u16,
    /// Next used-ring entry the device will write.
    pub next_used: u16,
    /// VIRTIO_F_RING_EVENT_IDX negotiated.
    pub event_idx_enabled: bool,
    /// The size the driver chose.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Guest-physical address of the descriptor table.
    pub desc_table: u64,
    /// Guest-physical address of the available (driver) ring.
    pub avail_ring: u64,
    /// Guest-physical address of the used (device) ring.
    pub used_ring: u64,
}

impl From<QueueState> for SavedQueue {
    fn from(s: QueueState) -> Self {
        SavedQueue {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

impl SavedQueue {
    /// Saves `queue`.
    pub fn save(queue: &Queue) -> Self {
        queue.state().into()
    }

    /// Rebuilds queue `index`, checking what virtio-queue checks when a
    /// driver sets it up (power-of-two sizes, ring alignment).
    pub fn restore(&self, index: usize) -> Result<Queue, PersistError> {
        let state = QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        };
        Queue::try_from(state).map_err(|source| PersistError::Queue { index, source })
    }
}

/// Checks a state's version.
pub(crate) fn check_version(
    what: &'static str,
    found: u32,
    expected: u32,
) -> Result<(), PersistError> {
    if found == expected {
        Ok(())
    } else {
        Err(PersistError::Version {
            what,
            found,
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use virtio_queue::QueueT;

    use super::*;

    #[test]
    fn queue_round_trips_and_bad_queues_are_refused() {
        let mut q = Queue::new(256).expect("queue");
        q.set_size(16);
        q.set_desc_table_address(Some(0x1000), Some(0));
        q.set_avail_ring_address(Some(0x2000), Some(0));
        q.set_used_ring_address(Some(0x3000), Some(0));
        q.set_ready(true);
        q.set_next_avail(7);
        q.set_next_used(5);
        let saved = SavedQueue::save(&q);
        let json = serde_json::to_string(&saved).expect("serialise");
        let back: SavedQueue = serde_json::from_str(&json).expect("deserialise");
        let restored = back.restore(0).expect("restore");
        assert_eq!(restored, q);

        let bad = SavedQueue { size: 3, ..saved };
        assert!(matches!(
            bad.restore(1),
            Err(PersistError::Queue { index: 1, .. })
        ));
        let bad = SavedQueue {
            used_ring: 0x3001,
            ..saved
        };
        assert!(bad.restore(0).is_err());
    }
}
