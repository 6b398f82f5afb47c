//! Files and folders of one sandbox under the daemon's run dir. The daemon,
//! the supervisor and the runtimes all compute paths from here so they
//! agree; it depends on nothing of theirs.

use std::path::{Path, PathBuf};

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

    /// The supervisor's config, written by the daemon before it starts it.
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
    /// Where a host-owned root's layers are attached idmapped while the
    /// root's overlay is mounted.
    pub fn idmapped_layers(&self) -> PathBuf {
        self.dir.join("idmapped")
    }
    /// Where a pod container's root is made (its layers attached idmapped,
    /// its overlay mounted) before it is handed to the agent; empty after.
    pub fn pod_roots(&self) -> PathBuf {
        self.dir.join("pod-roots")
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
