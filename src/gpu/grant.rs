//! What a sandbox is given on top of the base container spec: device nodes
//! (bind-mounted from the host and allowed in its device cgroup), read-only
//! host files, and /proc paths to mask. Carried from the daemon to the
//! supervisor in `SupervisorConfig` and applied by `runtime::spec::build_spec`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A character device the sandbox may read and write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedDevice {
    /// The node on the host, bind-mounted into the sandbox (a user
    /// namespace cannot mknod).
    pub host_path: PathBuf,
    /// Where it appears in the sandbox, under /dev.
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

/// A host file bind-mounted read-only (driver libraries, tools).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedFile {
    pub host_path: PathBuf,
    /// Where it appears in the sandbox.
    pub path: PathBuf,
}

/// Everything extra one sandbox's spec gets; empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceGrant {
    #[serde(default)]
    pub devices: Vec<GrantedDevice>,
    #[serde(default)]
    pub files: Vec<GrantedFile>,
    /// Paths under /proc hidden from the sandbox (other GPUs' entries).
    #[serde(default)]
    pub masked_paths: Vec<String>,
}

impl DeviceGrant {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.files.is_empty() && self.masked_paths.is_empty()
    }
}

/// The grant plus the environment every process of the sandbox gets
/// (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, `LD_LIBRARY_PATH`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuGrant {
    pub devices: DeviceGrant,
    pub env: Vec<(String, String)>,
}
