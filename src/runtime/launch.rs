//! The runtimes' one entry: start, checkpoint and tear down a sandbox of any
//! kind. Each call dispatches on the spec's [`RuntimeSpec`], so the
//! supervisor never asks which runtime it runs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::mount::{umount2, MntFlags};

use super::cgroups::{Layout, SandboxCgroups};
use super::container::{self, ContainerError};
use super::criu::{self, CriuError};
use super::microvm::{self, MicrovmError};
use super::paths::SandboxPaths;
use super::sandbox::{Checkpoint, Laps, RuntimeSpec, SandboxSpec, Started};
use crate::net::netns;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error(transparent)]
    Criu(#[from] CriuError),
    #[error(transparent)]
    Microvm(#[from] MicrovmError),
    /// Asked of a sandbox whose runtime does not do it (a scratch-disk copy
    /// of a container).
    #[error("{0}")]
    Unsupported(&'static str),
}

impl RuntimeError {
    /// The API error code of a failure the caller can fix (a volume the
    /// image has no place for); `None` for the host's.
    pub fn callers_code(&self) -> Option<&'static str> {
        match self {
            RuntimeError::Container(ContainerError::Volume(e)) if e.is_callers() => {
                Some("invalid_volume")
            }
            _ => None,
        }
    }
}

/// Makes and starts the sandbox of `spec`: a container, a container's fork
/// restored from its checkpoint, or a microVM. On error the caller runs
/// [`destroy_sandbox`], which removes whatever was made.
pub fn start(spec: &SandboxSpec, paths: &SandboxPaths) -> Result<Started, RuntimeError> {
    let restore = match &spec.kind {
        RuntimeSpec::Vm(vm) => return Ok(microvm::start(spec, paths, vm)?),
        RuntimeSpec::Container => None,
        RuntimeSpec::ContainerRestore(restore) => Some(restore),
    };
    let laps = Laps::start();
    // In the host's mount namespace: the daemon and the supervisor reach
    // the namespace through its pin for as long as the sandbox lives.
    container::prepare_netns(spec, paths)?;
    let start = move || -> Result<Started, RuntimeError> {
        Ok(match restore {
            Some(restore) => criu::restore(spec, paths, restore, laps)?,
            None => container::start(spec, paths, laps)?,
        })
    };
    if !super::mount_ns::is_own(spec) {
        return start();
    }
    super::mount_ns::start_in_own(&spec.id, start).map_err(|e| ContainerError::Prepare {
        what: "start thread",
        source: e,
    })?
}

/// Where a checkpoint goes, and what CRIU needs for a container's. The
/// daemon sends it as it is in `SupervisorRequest::Checkpoint`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointTarget {
    /// The `criu` binary (unused for a microVM).
    pub criu: PathBuf,
    /// The sandbox's freezer group, frozen by the daemon (empty for a
    /// microVM, whose VMM pauses the guest itself).
    pub freezer: PathBuf,
    /// Where the checkpoint's images go.
    pub images_dir: PathBuf,
    /// CRIU's work directory; a microVM's scratch-disk copy goes here.
    pub work_dir: PathBuf,
}

/// Checkpoints the running sandbox, which runs on afterwards: a container's
/// tree with CRIU, a microVM's memory and devices by its VMM with its
/// scratch disk cloned beside them (a microVM's [`Checkpoint`] is empty).
pub fn checkpoint(
    spec: &SandboxSpec,
    paths: &SandboxPaths,
    init_pid: i32,
    target: &CheckpointTarget,
) -> Result<Checkpoint, RuntimeError> {
    match &spec.kind {
        RuntimeSpec::Container | RuntimeSpec::ContainerRestore(_) => Ok(criu::dump(
            &target.criu,
            init_pid,
            paths,
            &target.freezer,
            &target.images_dir,
            &target.work_dir,
        )?),
        RuntimeSpec::Vm(vm) => {
            let disk_copy = target.work_dir.join(microvm::SNAPSHOT_DISK);
            microvm::snapshot(
                paths,
                vm.uid,
                &spec.layer_dir,
                &target.images_dir,
                &disk_copy,
            )?;
            Ok(Checkpoint::default())
        }
    }
}

/// A crash-consistent copy of a microVM's scratch disk at `to`; a container
/// has none.
pub fn clone_disk(spec: &SandboxSpec, paths: &SandboxPaths, to: &Path) -> Result<(), RuntimeError> {
    match &spec.kind {
        RuntimeSpec::Vm(_) => Ok(microvm::clone_disk_paused(paths, &spec.layer_dir, to)?),
        RuntimeSpec::Container | RuntimeSpec::ContainerRestore(_) => Err(
            RuntimeError::Unsupported("only a microVM has a scratch disk"),
        ),
    }
}

/// Removes everything a start of any kind made, whatever state it was left
/// in: kills every process through the cgroups (a microVM's VMM included),
/// deletes a container's libcontainer state, unmounts the root and removes
/// the namespace. Errors are collected, not fatal, so one stuck step does
/// not leave the rest behind. Needs no spec, only what the daemon keeps, so
/// it also finishes a sandbox whose supervisor is gone; every step is a
/// no-op where its part was never made or is already gone.
pub fn destroy_sandbox(id: &str, cgroups_path: &str, paths: &SandboxPaths) -> Vec<String> {
    let mut problems = Vec::new();
    let cgroups = SandboxCgroups::new(Layout::detect(), cgroups_path);
    // A kill that left a task behind (one in uninterruptible sleep) leaves
    // its groups busy for longer than any wait here: then one try each.
    let until = match cgroups.kill_all() {
        Ok(()) => Instant::now() + super::cgroups::RMDIR_PATIENCE,
        Err(e) => {
            problems.push(e.to_string());
            Instant::now()
        }
    };
    cgroups.remove_process_groups(until);
    problems.extend(container::remove_state(id, paths));
    // Every group: libcontainer's, the per-process ones, a microVM's.
    if let Err(e) = cgroups.destroy(until) {
        problems.push(e.to_string());
    }
    problems.extend(super::pod_roots::unmount_staging(paths));
    match umount2(&paths.rootfs(), MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => problems.push(format!("unmounting root: {e}")),
    }
    if let Err(e) = netns::remove(&paths.netns()) {
        problems.push(e.to_string());
    }
    problems
}
