//! virtio-blk: a disk backed by a host file (opened by path, or handed in as
//! an open descriptor), served by a worker thread with synchronous
//! positional I/O. IN, OUT, FLUSH and GET_ID; everything else answers
//! UNSUPP. A read-only disk is opened read-only and advertises
//! VIRTIO_BLK_F_RO, and every OUT to it fails with IOERR whatever the driver
//! negotiated: the base image is shared by every VM and must never change.
//!
//! A disk started empty is a *slot*: 0 sectors until a read-only disk is
//! put in while the guest runs (`Block::change_medium`, reached through
//! the control socket), announced with a configuration-change interrupt, as
//! Firecracker's drive update is. Linux's virtio_blk then reads the new
//! capacity; the disk's GET_ID (`diskN`) says which slot it is.

pub mod device;
pub mod persist;

pub use device::{Block, BlockError, Disk, MediumError, RequestHeader, SECTOR_SIZE};
pub use persist::{BlockState, BLOCK_STATE_VERSION};
