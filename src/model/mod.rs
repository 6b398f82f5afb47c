//! The domain's own vocabulary: what a sandbox and a process are, their
//! limits, states and metered use, and what a create asks for. The bottom
//! layer: everything may import it; it imports only the egress policy's
//! request form (`net::policy::NetworkPolicy`). The
//! HTTP bodies (`api::types`), the supervisor protocol, sandbox records and
//! snapshot metadata are all spelled in these types; serde derives are here
//! because records and frames persist them.

mod create;
mod ports;
mod process;
mod sandbox;

pub use create::{CreateRequest, HOST_ROOTFS_IMAGE};
pub use ports::{ExposedPort, PortAuth, PortProtocol, PortRequest};
pub use process::{interpreter_argv, Process, ProcessState, PYTHON_ARGV};
pub use sandbox::{
    HostVolume, Limits, RootLimits, RuntimeKind, SandboxState, SandboxStats, UnknownRuntime, Usage,
    ID_MAP_SIZE,
};
