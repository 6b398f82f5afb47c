//! Restoring (forking) a VM from a snapshot directory: check the state file
//! (bounded, versioned, checksummed) and the memory file (size, digest or
//! a matching verification stamp) before anything is built; map the memory
//! file private; then the KVM VM, its irqchip/PIT/clock, the devices (the
//! disks given again, matched against the saved list; a new vsock socket,
//! same CID; the tap named again, same MAC), the serial port and the vCPUs, ready for `Machine::run`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::{self, MemoryFileError};
use super::stamp;
use super::state::{self, SavedDevice, SnapshotState, StateFileError};
use super::{MEMORY_FILE, STATE_FILE};
use crate::builder::{attach_virtio, legacy_devices, BuildError};
use crate::config::{DiskConfig, NetConfig};
use crate::devices::bus::Bus;
use crate::devices::serial::{IrqTrigger, SerialDevice, SerialSink};
use crate::devices::virtio::block::{Block, Disk};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::persist::{DeviceState, PersistError};
use crate::devices::virtio::vsock::{Vsock, VsockUnixBackend};
use crate::devices::virtio::VirtioDevice;
use crate::machine::{Machine, MachineDevices, MachineShape};
use crate::stop::StopLatch;
use crate::vstate::kvm::KvmContext;
use crate::vstate::vcpu::{Vcpu, VcpuError};
use crate::vstate::vm::{Vm, VmStateError};

/// When to hash the whole memory file on restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyMemory {
    /// Unless a verification stamp shows the file unchanged since it was
    /// last checked (see [`stamp`]).
    #[default]
    Stamp,
    /// Every time.
    Always,
}

/// How to restore.
#[derive(Clone, Debug)]
pub struct RestoreConfig {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// The disks, again, in the saved order.
    pub disks: Vec<DiskConfig>,
    /// The new VM's vsock socket (the snapshot had a vsock device iff set).
    pub vsock_uds: Option<PathBuf>,
    /// The tap to attach the restored net device to (the snapshot had a net
    /// device iff set; its MAC must be the saved one).
    pub net: Option<NetConfig>,
    /// Serial output cap.
    pub serial_cap_bytes: u64,
    /// The KVM device.
    pub kvm_device: PathBuf,
    /// Run time limit.
    pub timeout: Option<Duration>,
    /// Memory check policy.
    pub verify_memory: VerifyMemory,
}

/// Why a snapshot could not be restored. Nothing runs when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The state file is missing, corrupt, truncated or of another version.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The memory file is missing, corrupt or truncated.
    #[error(transparent)]
    Memory(#[from] MemoryFileError),
    /// The devices given do not match the snapshot's.
    #[error("the restore's devices do not match the snapshot: {0}")]
    Devices(String),
    /// A device could not be restored.
    #[error("cannot restore virtio device {index}: {source}")]
    Device {
        /// Its index.
        index: usize,
        /// Why.
        #[source]
        source: PersistError,
    },
    /// KVM or device setup failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The irqchip/PIT/clock could not be restored.
    #[error(transparent)]
    VmState(#[from] VmStateError),
    /// A vCPU could not be restored.
    #[error("cannot restore vCPU {id}: {source}")]
    Vcpu {
        /// The vCPU.
        id: u8,
        /// Why.
        #[source]
        source: VcpuError,
    },
}

fn describe(d: &SavedDevice) -> String {
    match d {
        SavedDevice::Block {
            id,
            read_only,
            capacity,
        } => format!(
            "{id} ({}, {capacity} sectors)",
            if *read_only { "ro" } else { "rw" }
        ),
        SavedDevice::Vsock { cid } => format!("vsock (CID {cid})"),
        SavedDevice::Net { mac } => format!("net (MAC {mac})"),
    }
}

/// Checks the device list given against the saved one, before any file or
/// socket is opened.
fn match_devices(state: &SnapshotState, config: &RestoreConfig) -> Result<(), RestoreError> {
    let saved = &state.config.devices;
    let disks = saved
        .iter()
        .filter(|d| matches!(d, SavedDevice::Block { .. }))
        .count();
    let has_vsock = saved.iter().any(|d| matches!(d, SavedDevice::Vsock { .. }));
    let list = || saved.iter().map(describe).collect::<Vec<_>>().join(", ");
    if disks != config.disks.len() {
        return Err(RestoreError::Devices(format!(
            "the snapshot has {disks} disk(s) [{}]; give the same disks with --disk, in order \
             ({} given)",
            list(),
            config.disks.len()
        )));
    }
    if has_vsock != config.vsock_uds.is_some() {
        return Err(RestoreError::Devices(if has_vsock {
            "the snapshot has a vsock device: give --vsock-uds (a new socket path)".into()
        } else {
            "the snapshot has no vsock device: drop --vsock-uds".into()
        }));
    }
    let saved_net = saved.iter().find_map(|d| match d {
        SavedDevice::Net { mac } => Some(*mac),
        _ => None,
    });
    match (saved_net, &config.net) {
        (Some(_), None) => {
            return Err(RestoreError::Devices(
                "the snapshot has a net device: give --net TAP (a persistent tap in this \
                 network namespace)"
                    .into(),
            ))
        }
        (None, Some(_)) => {
            return Err(RestoreError::Devices(
                "the snapshot has no net device: drop --net".into(),
            ))
        }
        (Some(saved), Some(n)) if saved != n.mac => {
            return Err(RestoreError::Devices(format!(
                "the snapshot's guest has MAC {saved}, --net gives {}: use --net {},mac={saved}",
                n.mac, n.tap
            )))
        }
        _ => {}
    }
    Ok(())
}

/// Restores the snapshot in `config.dir`, with serial output to
/// `serial_out`. Checks everything before building anything.
pub fn restore(
    config: &RestoreConfig,
    serial_out: Box<dyn Write + Send>,
) -> Result<Machine, RestoreError> {
    let started = Instant::now();
    let state = state::read_state(&config.dir.join(STATE_FILE))?;
    match_devices(&state, config)?;

    let mem_path = config.dir.join(MEMORY_FILE);
    let file = memory::open_memory(&mem_path, &state.memory)?;
    let dup = file.try_clone().map_err(|source| MemoryFileError::Read {
        path: mem_path.display().to_string(),
        source,
    })?;
    let mem = memory::map_memory(dup, &state.memory)?;
    let verified = config.verify_memory == VerifyMemory::Stamp
        && stamp::is_verified(&config.dir, &file, &state.memory.sha256);
    if !verified {
        memory::verify_memory(&mem, &file, &state.memory, &mem_path)?;
        stamp::record(&config.dir, &file, &state.memory.sha256);
    }
    // `file` closes here; the mappings keep the memory file alive (and its
    // page cache shared) for as long as this VM runs, even if the snapshot
    // directory is deleted.
    drop(file);

    // Disks before KVM: a wrong disk is the likelier mistake.
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    let mut disks = config.disks.iter();
    for (index, saved) in state.virtio.iter().enumerate() {
        let dev_err = |source| RestoreError::Device { index, source };
        let device: Box<dyn VirtioDevice> = match &saved.device {
            DeviceState::Block(b) => {
                let Some(disk) = disks.next() else {
                    return Err(RestoreError::Devices("fewer disks than saved".into()));
                };
                let disk = Disk::from_config(disk, &b.id).map_err(BuildError::from)?;
                Box::new(Block::restore(b, disk).map_err(dev_err)?)
            }
            DeviceState::Vsock(v) => {
                let Some(uds) = &config.vsock_uds else {
                    return Err(RestoreError::Devices("no --vsock-uds".into()));
                };
                let backend = VsockUnixBackend::new(v.cid, uds).map_err(BuildError::from)?;
                Box::new(Vsock::restore(v, backend).map_err(dev_err)?)
            }
            DeviceState::Net(n) => {
                let Some(net) = &config.net else {
                    return Err(RestoreError::Devices("no --net".into()));
                };
                let device = Net::new(&net.tap, n.mac).map_err(BuildError::from)?;
                Box::new(Net::restore(n, device).map_err(dev_err)?)
            }
        };
        devices.push(device);
    }

    let kvm = KvmContext::open(&config.kvm_device).map_err(BuildError::from)?;
    let vm = Vm::new(&kvm, &mem).map_err(BuildError::from)?;
    vm.restore_state(&state.vm)?;

    // vCPUs (their local APICs) before the devices: a restored device may
    // raise an interrupt at once (vsock's TRANSPORT_RESET), and a LAPIC
    // restored after it would drop it from its IRR, leaving a halted guest
    // halted for good.
    let vcpus = state
        .vcpus
        .iter()
        .map(|s| {
            let vcpu =
                Vcpu::new(&vm, s.id).map_err(|source| RestoreError::Vcpu { id: s.id, source })?;
            vcpu.restore_state(s)
                .map_err(|source| RestoreError::Vcpu { id: s.id, source })?;
            Ok(vcpu)
        })
        .collect::<Result<Vec<_>, RestoreError>>()?;

    let mut mmio = Bus::new();
    let mut virtio = Vec::with_capacity(devices.len());
    for (index, (device, saved)) in devices.into_iter().zip(&state.virtio).enumerate() {
        let (_, transport) = attach_virtio(&vm, &mem, &mut mmio, index, device, |d, m, i| {
            MmioTransport::restore(d, m, i, &saved.transport)
                .map_err(|source| BuildError::Restore(format!("virtio device {index}: {source}")))
        })?;
        virtio.push(transport);
    }

    let latch = Arc::new(StopLatch::new());
    let sink = SerialSink::new(serial_out, config.serial_cap_bytes, started);
    let serial = SerialDevice::from_state(
        &state.serial,
        IrqTrigger::new().map_err(BuildError::from)?,
        sink,
    )
    .map_err(BuildError::from)?;
    let (pio, serial) = legacy_devices(&vm, serial, &latch)?;

    Ok(Machine::new(
        kvm,
        vm,
        mem,
        vcpus,
        MachineDevices {
            pio,
            mmio,
            latch,
            serial,
            virtio,
        },
        config.timeout,
        MachineShape {
            mem_mib: state.config.mem_mib,
            vcpus: state.config.vcpus,
        },
    ))
}

/// The snapshot directory's state, checked (for tools and tests).
pub fn inspect(dir: &Path) -> Result<SnapshotState, StateFileError> {
    state::read_state(&dir.join(STATE_FILE))
}
