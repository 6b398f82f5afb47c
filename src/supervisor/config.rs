//! What the daemon tells a sandbox's supervisor, and where that sandbox's
//! runtime files live. Both sides compute paths from here so they agree.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Written by the daemon as `shim.json` before it starts the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SupervisorConfig {
    pub id: String,
    pub hostname: String,
    pub image_rootfs: PathBuf,
    /// Read-only layers above the image (snapshots' writes), top first.
    #[serde(default)]
    pub image_layers: Vec<PathBuf>,
    /// The btrfs subvolume holding `upper/` and `work/`.
    pub layer_dir: PathBuf,
    pub agent_path: PathBuf,
    pub cgroups_path: String,
    pub cpu: f64,
    pub memory_bytes: u64,
    pub pids: i64,
    pub id_map_base: u32,
    pub id_map_size: u32,
    pub shm_bytes: u64,
    pub nofile: u64,
    /// The environment every process starts with (sandbox defaults + create env).
    pub env: Vec<(String, String)>,
    /// Bytes of stdout+stderr kept per process for late readers.
    pub output_buffer_bytes: usize,
    pub ready_timeout_ms: u64,
    /// Extra device nodes, files and masks (a GPU sandbox's); absent in
    /// configs written before GPUs existed.
    #[serde(default)]
    pub devices: crate::gpu::DeviceGrant,
    /// The egress policy (the daemon's default already applied); absent in
    /// configs written before egress existed, which then means block.
    #[serde(default)]
    pub network: crate::net::policy::NetworkPolicy,
    /// Where the egress proxy dials from and resolves with.
    #[serde(default)]
    pub upstream: crate::net::upstream::UpstreamConfig,
    /// The egress proxy's caps.
    #[serde(default)]
    pub egress_limits: crate::net::limits::EgressLimits,
    /// Set for a fork: restore this checkpoint instead of starting the
    /// container afresh.
    #[serde(default)]
    pub restore: Option<crate::runtime::criu::RestoreSpec>,
    /// Set for a microVM sandbox: boot this VM instead of a container.
    #[serde(default)]
    pub vm: Option<crate::runtime::microvm::VmSpec>,
}

impl SupervisorConfig {
    pub fn is_vm(&self) -> bool {
        self.vm.is_some()
    }
}

/// Files and folders of one sandbox under the daemon's run dir.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    pub dir: PathBuf,
}

impl SandboxPaths {
    pub fn new(sandboxes_run_dir: &Path, id: &str) -> Self {
        Self {
            dir: sandboxes_run_dir.join(id),
        }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join("shim.json")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("shim.sock")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("shim.log")
    }
    pub fn netns(&self) -> PathBuf {
        self.dir.join("netns")
    }
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }
    /// libcontainer's state root (it keeps `<root>/<id>/state.json`).
    pub fn container_root(&self) -> PathBuf {
        self.dir.join("container")
    }
    /// Host-side files bind-mounted read-only into the sandbox's /etc.
    pub fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }
}
