//! virtio-vsock, implemented in the VMM (this host has no vhost-vsock), with
//! Firecracker's host side: a Unix socket at `uds_path`.
//!
//! - Host to guest: a host process connects to `uds_path`, writes
//!   `CONNECT <port>\n`; the VMM opens a stream to the guest's `port` and,
//!   once the guest accepts, answers `OK <host_port>\n`; then bytes flow both
//!   ways. A refused connection is closed without an answer.
//! - Guest to host: a guest connection to host port P (CID 2) is a Unix
//!   connection to `<uds_path>_<P>`; if nothing listens there the guest gets
//!   a reset.
//!
//! [`packet`] parses and writes packets, [`unix_backend`] is the connection
//! multiplexer (credit-based flow control, shutdown, resets), [`device`]
//! moves packets between the virtqueues and the backend, [`persist`] is the
//! saved state.

pub mod device;
pub mod packet;
pub mod persist;
pub mod unix_backend;

pub use device::{Vsock, VsockError};
pub use persist::{VsockState, VSOCK_STATE_VERSION};
pub use unix_backend::VsockUnixBackend;

/// The host's context ID.
pub const HOST_CID: u64 = 2;
/// RX queue index (device to driver).
pub const RXQ: usize = 0;
/// TX queue index (driver to device).
pub const TXQ: usize = 1;
/// Event queue index.
pub const EVQ: usize = 2;

/// Stream socket type (the only one supported; SEQPACKET is not offered).
pub const TYPE_STREAM: u16 = 1;

/// Connection request.
pub const VSOCK_OP_REQUEST: u16 = 1;
/// Connection accepted.
pub const VSOCK_OP_RESPONSE: u16 = 2;
/// Connection reset (refused or aborted).
pub const VSOCK_OP_RST: u16 = 3;
/// The sender will not receive and/or send any more.
pub const VSOCK_OP_SHUTDOWN: u16 = 4;
/// Data.
pub const VSOCK_OP_RW: u16 = 5;
/// The sender's credit counters, unsolicited or answering a request.
pub const VSOCK_OP_CREDIT_UPDATE: u16 = 6;
/// Asks the peer for a credit update.
pub const VSOCK_OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flag: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// SHUTDOWN flag: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// Event queue event: all connections are gone (sent after a restore).
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Lowest guest CID (0-2 are reserved).
pub const MIN_GUEST_CID: u64 = 3;
/// Highest guest CID: Linux's CIDs are 32-bit, and u32::MAX is
/// VMADDR_CID_ANY.
pub const MAX_GUEST_CID: u64 = u32::MAX as u64 - 1;
