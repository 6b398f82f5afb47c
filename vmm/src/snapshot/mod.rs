//! VM snapshots: a paused VM written to a directory (`memory`, `state`,
//! `memory.verified`), and VMs restored (forked) from one.
//!
//! - [`memory`]: the sparse memory file, its digest, mapping it private;
//! - [`state`]: the versioned, checksummed, bounded state file;
//! - [`stamp`]: skipping the full memory check for forks after the first;
//! - [`restore`]: building a [`crate::Machine`] from a snapshot.
//!
//! Taking one goes through [`crate::MachineHandle::snapshot`].

pub mod memory;
pub mod restore;
pub mod stamp;
pub mod state;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::devices::virtio::persist::{DeviceState, VirtioMmioState};
use crate::vstate::pause::PauseError;
use memory::MemoryFileError;
use state::{SavedConfig, SavedDevice, SnapshotState, StateFileError};

/// Name of the memory file in a snapshot directory.
pub const MEMORY_FILE: &str = "memory";
/// Name of the state file in a snapshot directory.
pub const STATE_FILE: &str = "state";

/// Why a snapshot could not be taken. The VM stays paused (when it could be
/// paused) so the caller decides whether to resume it.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The directory is not usable.
    #[error("snapshot directory {path}: {why}")]
    Directory {
        /// The directory.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The VM could not be paused or its vCPUs saved.
    #[error(transparent)]
    Pause(#[from] PauseError),
    /// The irqchip/PIT/clock could not be saved.
    #[error(transparent)]
    VmState(#[from] crate::vstate::vm::VmStateError),
    /// A device could not be stopped or restarted.
    #[error("cannot pause or resume a virtio device: {0}")]
    Device(#[from] crate::devices::virtio::ActivateError),
    /// The memory file could not be written.
    #[error(transparent)]
    Memory(#[from] MemoryFileError),
    /// The state file could not be written.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// A disk slot holds a disk handed in while the VM ran.
    #[error("{0} is a slot holding a disk, which a restore could not reopen: empty the slot before a snapshot")]
    SlotInUse(String),
}

/// What a snapshot wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Bytes written to `memory` (touched pages) and `state`.
    pub bytes_written: u64,
    /// Guest RAM bytes in the memory file's data (the rest are holes).
    pub memory_data_bytes: u64,
    /// From the request to the files being written (pause included).
    pub elapsed: Duration,
}

/// Checks that `dir` exists, is a directory, and is empty.
pub(crate) fn check_directory(dir: &Path) -> Result<(), SnapshotError> {
    let bad = |why: String| SnapshotError::Directory {
        path: dir.display().to_string(),
        why,
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| bad(format!("{e}; it must be an existing, empty directory")))?;
    if entries.next().is_some() {
        return Err(bad("not empty; give an empty directory".into()));
    }
    Ok(())
}

/// The device list a restore is matched against.
pub(crate) fn saved_devices(virtio: &[VirtioMmioState]) -> Vec<SavedDevice> {
    virtio
        .iter()
        .map(|v| match &v.device {
            DeviceState::Block(b) => SavedDevice::Block {
                id: b.id.clone(),
                read_only: b.read_only,
                capacity: b.capacity,
            },
            DeviceState::Vsock(s) => SavedDevice::Vsock { cid: s.cid },
            DeviceState::Net(n) => SavedDevice::Net { mac: n.mac },
        })
        .collect()
}

/// The parts of a paused VM a snapshot is made of.
pub(crate) struct PausedVm<'a> {
    pub config: SavedConfig,
    pub vm: &'a crate::vstate::vm::Vm,
    pub mem: &'a vm_memory::GuestMemoryMmap,
    pub vcpus: Vec<crate::vstate::vcpu::VcpuState>,
    pub serial: crate::devices::serial::SerialDeviceState,
    pub virtio: Vec<VirtioMmioState>,
}

/// Writes the snapshot of a paused VM into (existing, empty) `dir`: memory
/// first, the state last, so a directory with a `state` is complete; then
/// the verification stamp.
pub(crate) fn write_snapshot(
    paused: PausedVm<'_>,
    dir: &Path,
    started: Instant,
) -> Result<SnapshotReport, SnapshotError> {
    let vm = paused.vm.save_state()?;
    let mem_path = dir.join(MEMORY_FILE);
    let layout = memory::write_memory(paused.mem, &mem_path)?;
    let data = layout.data_bytes();
    let sha = layout.sha256.clone();
    let snapshot = SnapshotState {
        config: paused.config,
        memory: layout,
        vcpus: paused.vcpus,
        vm,
        serial: paused.serial,
        virtio: paused.virtio,
    };
    let state_bytes = state::write_state(&snapshot, &dir.join(STATE_FILE))?;
    if let Ok(file) = std::fs::File::open(&mem_path) {
        stamp::record(dir, &file, &sha);
    }
    Ok(SnapshotReport {
        bytes_written: data + state_bytes,
        memory_data_bytes: data,
        elapsed: started.elapsed(),
    })
}
