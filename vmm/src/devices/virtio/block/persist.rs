//! virtio-blk saved state. The disk's contents are not state (they live in
//! the disk file); what is saved is what the guest was told about the disk,
//! so a restore onto a different disk (size, read-only-ness) is refused
//! instead of corrupting a guest that still believes the old geometry. The
//! queues and features are in the transport's state.

use serde::{Deserialize, Serialize};

use super::device::{Block, Disk};
use crate::devices::virtio::persist::{check_version, PersistError};

/// Version of [`BlockState`].
pub const BLOCK_STATE_VERSION: u32 = 1;

/// A block device's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// [`BLOCK_STATE_VERSION`].
    pub version: u32,
    /// The GET_ID string.
    pub id: String,
    /// Whether the disk is read-only.
    pub read_only: bool,
    /// Capacity in sectors, as the guest saw it.
    pub capacity: u64,
}

impl Block {
    /// Saves the device's own state.
    pub fn save(&self) -> BlockState {
        BlockState {
            version: BLOCK_STATE_VERSION,
            id: self.id().into(),
            read_only: self.read_only(),
            capacity: self.capacity(),
        }
    }

    /// A device for `disk` (the same disk, reopened) matching `state`. Put
    /// it behind `MmioTransport::restore` to resume its queues.
    pub fn restore(state: &BlockState, disk: Disk) -> Result<Self, PersistError> {
        check_version("virtio-blk", state.version, BLOCK_STATE_VERSION)?;
        if disk.read_only() != state.read_only {
            return Err(PersistError::Mismatch(format!(
                "disk {} was saved {} but is now configured {}",
                state.id,
                if state.read_only {
                    "read-only"
                } else {
                    "writable"
                },
                if disk.read_only() {
                    "read-only"
                } else {
                    "writable"
                },
            )));
        }
        if disk.capacity() != state.capacity {
            return Err(PersistError::Mismatch(format!(
                "disk {} had {} sectors when saved, the file now has {}",
                state.id,
                state.capacity,
                disk.capacity()
            )));
        }
        Block::new(disk, &state.id).map_err(|e| PersistError::Device(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use virtio_bindings::virtio_blk::VIRTIO_BLK_T_IN;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::devices::virtio::block::device::RequestHeader;
    use crate::devices::virtio::mmio::{MmioTransport, MmioTransportState};
    use crate::devices::virtio::testing::{self, Desc, DriverSetup, GuestQueue, BUFFERS, F_WRITE};
    use crate::devices::virtio::{Interrupt, VIRTIO_F_VERSION_1};

    fn disk(sectors: u64, read_only: bool) -> Disk {
        let f = super::super::device::tests_support::disk_file(sectors);
        Disk::from_file(f, read_only, "d", "test").expect("disk")
    }

    fn read_sector(
        mem: &vm_memory::GuestMemoryMmap,
        g: &mut GuestQueue,
        t: &mut MmioTransport,
        sector: u64,
    ) -> Vec<(u32, u32)> {
        mem.write_obj(
            RequestHeader {
                request_type: VIRTIO_BLK_T_IN,
                reserved: 0,
                sector,
            },
            GuestAddress(BUFFERS),
        )
        .expect("header");
        let flags = |f| Desc {
            addr: 0,
            len: 0,
            flags: f,
            next: 0,
        };
        g.add_chain(&[
            Desc {
                addr: BUFFERS,
                len: 16,
                ..flags(0)
            },
            Desc {
                addr: BUFFERS + 0x1000,
                len: 512,
                ..flags(F_WRITE)
            },
            Desc {
                addr: BUFFERS + 0x100,
                len: 1,
                ..flags(F_WRITE)
            },
        ]);
        testing::write32(t, 0x50, 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let used = g.take_used();
            if !used.is_empty() || Instant::now() > deadline {
                return used;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn state_round_trips_and_the_restored_device_continues() {
        let block = Block::new(disk(8, false), "scratch").expect("block");
        let mem = testing::memory();
        let mut t = MmioTransport::new(
            Box::new(block),
            mem.clone(),
            Arc::new(Interrupt::new().expect("irq")),
        );
        let setup = DriverSetup::for_sizes(&[16]);
        testing::init_driver(&mut t, &setup, 1 << VIRTIO_F_VERSION_1);
        let mut g = GuestQueue::new(&mem, setup.queues[0]);
        assert_eq!(read_sector(&mem, &mut g, &mut t, 1), vec![(0, 513)]);

        // Save: device state + transport state, through JSON.
        let saved_transport = t.save();
        assert_eq!(saved_transport.queues[0].next_used, 1);
        drop(t);
        let disk_again = disk(8, false);
        // (A fresh transport cannot reach the old Block; save it the way a
        // snapshot would, from a device with the same configuration.)
        let dev_state = Block::new(disk(8, false), "scratch").expect("block").save();
        let json = serde_json::to_string(&(&dev_state, &saved_transport)).expect("serialise");
        let (dev_back, transport_back): (BlockState, MmioTransportState) =
            serde_json::from_str(&json).expect("deserialise");
        assert_eq!(dev_back, dev_state);

        let block = Block::restore(&dev_back, disk_again).expect("restore device");
        assert_eq!(block.save(), dev_state);
        let mut t = MmioTransport::restore(
            Box::new(block),
            mem.clone(),
            Arc::new(Interrupt::new().expect("irq")),
            &transport_back,
        )
        .expect("restore transport");
        assert!(t.device().is_activated());
        assert_eq!(t.save(), saved_transport);
        // The queue carries on where it stopped: the next request is used
        // entry 1.
        assert_eq!(read_sector(&mem, &mut g, &mut t, 5), vec![(3, 513)]);
        let mut data = [0u8; 512];
        mem.read_slice(&mut data, GuestAddress(BUFFERS + 0x1000))
            .expect("read");
        assert_eq!(data, [5; 512]);
    }

    #[test]
    fn restore_onto_another_disk_is_refused() {
        let state = Block::new(disk(8, true), "base").expect("block").save();
        assert!(matches!(
            Block::restore(&state, disk(8, false)),
            Err(PersistError::Mismatch(_))
        ));
        assert!(matches!(
            Block::restore(&state, disk(9, true)),
            Err(PersistError::Mismatch(_))
        ));
        let old = BlockState {
            version: 0,
            ..state.clone()
        };
        assert!(matches!(
            Block::restore(&old, disk(8, true)),
            Err(PersistError::Version { .. })
        ));
        assert!(Block::restore(&state, disk(8, true)).is_ok());
    }
}
