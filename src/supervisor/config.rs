//! What the daemon tells a sandbox's supervisor: the runtime's spec of the
//! sandbox to make, and what only the supervisor uses (its output buffers and
//! the egress proxy's settings). Where the files live is
//! [`crate::runtime::paths`], shared with the daemon and the runtimes.

use serde::{Deserialize, Serialize};

use crate::runtime::sandbox::SandboxSpec;

/// Written by the daemon as `shim.json` before it starts the supervisor
/// (from the same binary, so both always agree on its shape).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SupervisorConfig {
    /// The sandbox the runtime makes.
    pub spec: SandboxSpec,
    /// Bytes of stdout+stderr kept per process for late readers.
    pub output_buffer_bytes: usize,
    /// The egress policy (the daemon's default already applied).
    #[serde(default)]
    pub network: crate::net::policy::NetworkPolicy,
    /// Where the egress proxy dials from and resolves with.
    #[serde(default)]
    pub upstream: crate::net::upstream::UpstreamConfig,
    /// The egress proxy's caps.
    #[serde(default)]
    pub egress_limits: crate::net::limits::EgressLimits,
    /// An interpreter the agent starts before the sandbox is reported
    /// ready (a pooled sandbox's), for run-code to fork from.
    #[serde(default)]
    pub warm_interpreter: Option<WarmInterpreter>,
}

/// An interpreter kept started in the sandbox, as run-code starts it
/// (`python3 -u`), run as the sandbox's process user with its environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmInterpreter {
    pub argv: Vec<String>,
    pub uid: u32,
    pub gid: u32,
}
