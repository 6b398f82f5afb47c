//! A sandbox's limits, lifecycle state, metered use and runtime kind.

use serde::{Deserialize, Serialize};

/// How many ids a sandbox's user namespace maps (0..65535 inside onto
/// `id_map_base..` on the host).
pub const ID_MAP_SIZE: u32 = 65536;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub cpu: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    pub pids: u64,
    /// The sandbox's CPU weight against the host's other sandboxes when
    /// the CPUs are contended, in cgroup v1 shares (2-262144; `None` is
    /// the kernel's default, 1024). A Kubernetes pod's is the sum of its
    /// containers' requests, as the kubelet gives its pod cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
}

/// Ceilings of one pod container root alone, within its sandbox's
/// (`POST /v1/sandboxes/{id}/roots` `limits`); `None` is the sandbox's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// Its CPU weight against the pod's other containers, in cgroup v1
    /// shares (a Kubernetes container's, from its CPU request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// An OOM kill in the root ends every process of it, not one (cgroup
    /// v2's `memory.oom.group`, which the kubelet sets on each container
    /// there since 1.28); refused on a cgroup v1 host's container.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_group: bool,
}

/// A host file or directory bound into one pod container root (`POST
/// /v1/sandboxes/{id}/roots` `volumes`): a Kubernetes volume as the
/// kubelet hands it to its runtime. Bound recursively, never with device
/// nodes or set-id bits in force, shown under the sandbox's ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostVolume {
    /// An absolute path on the daemon's host: a directory or a regular
    /// file, reached through no symlink at its last component.
    pub source: std::path::PathBuf,
    /// An absolute path in the container's root; symlinks in the image on
    /// the way are resolved inside that root.
    pub destination: String,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Ready,
    /// The sandbox died on its own (its agent exited or was killed).
    Failed,
    Deleting,
}

/// Metered use of one sandbox (sampled every few seconds while it runs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub memory_gib_seconds: f64,
    pub egress_bytes: u64,
    /// Bytes carried both ways through the ingress (preview URLs).
    #[serde(default)]
    pub ingress_bytes: u64,
}

/// A running sandbox's resource use read from its cgroups at the moment
/// of the call (`GET /v1/sandboxes/{id}/stats`), beside its limits: what a
/// scheduler or the containerd shim's task metrics need.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxStats {
    /// CPU time used so far by everything in the sandbox.
    pub cpu_seconds: f64,
    /// Memory charged to the sandbox now (page cache included).
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    /// Tasks (processes and threads) now.
    pub pids: u64,
    pub pids_limit: u64,
    pub oom_kills: u64,
}

/// What isolates a sandbox: a container on the host's kernel, or a KVM
/// microVM with its own. Spelled `"container"` / `"vm"` in the API, in
/// records and in snapshot metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    #[default]
    Container,
    Vm,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Container => "container",
            RuntimeKind::Vm => "vm",
        }
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A runtime name that is neither `container` nor `vm`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runtime must be \"container\" or \"vm\", got {0:?}")]
pub struct UnknownRuntime(pub String);

impl std::str::FromStr for RuntimeKind {
    type Err = UnknownRuntime;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "container" => Ok(RuntimeKind::Container),
            "vm" => Ok(RuntimeKind::Vm),
            other => Err(UnknownRuntime(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_kind_is_spelled_as_before_everywhere() {
        for kind in [RuntimeKind::Container, RuntimeKind::Vm] {
            let json = serde_json::to_string(&kind).expect("serialise");
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(kind.as_str().parse::<RuntimeKind>(), Ok(kind));
        }
        assert_eq!(
            "VM".parse::<RuntimeKind>().unwrap_err().to_string(),
            "runtime must be \"container\" or \"vm\", got \"VM\""
        );
    }
}
