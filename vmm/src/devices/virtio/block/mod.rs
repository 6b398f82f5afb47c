//! virtio-blk: a disk backed by a host file (opened by path, or handed in as
//! an open descriptor), served by a worker thread with synchronous
//! positional I/O. IN, OUT, FLUSH and GET_ID; everything else answers
//! UNSUPP. A read-only disk is opened read-only and advertises
//! VIRTIO_BLK_F_RO, and every OUT to it fails with IOERR whatever the driver
//! negotiated: the base image is shared by every VM and must never change.

pub mod device;
pub mod persist;

pub use device::{Block, BlockError, Disk, RequestHeader, SECTOR_SIZE};
pub use persist::{BlockState, BLOCK_STATE_VERSION};
