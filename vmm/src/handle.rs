//! [`MachineHandle`]: control of a running [`crate::Machine`] from another
//! thread (the control socket, tests): pause, resume, snapshot, stop. Operations
//! are serialised; a snapshot leaves the VM paused so the caller decides
//! what happens next (resume it, or stop it and keep the snapshot).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use crate::devices::serial::SerialDevice;
use crate::devices::virtio::block::MediumError;
use crate::devices::virtio::lock;
use crate::devices::virtio::mmio::MmioTransport;
use crate::snapshot::state::SavedConfig;
use crate::snapshot::{self, PausedVm, SnapshotError, SnapshotReport};
use crate::stop::{StopLatch, StopReason};
use crate::vstate::pause::RunControl;
use crate::vstate::vm::Vm;

/// A handle on a machine that may be running. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MachineHandle {
    pub(crate) control: Arc<RunControl>,
    pub(crate) vm: Arc<Vm>,
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) serial: Arc<Mutex<SerialDevice>>,
    pub(crate) virtio: Vec<Arc<Mutex<MmioTransport>>>,
    pub(crate) mem_mib: u64,
    pub(crate) vcpus: u8,
    /// Serialises pause/resume/snapshot; holds whether devices are paused.
    pub(crate) op: Arc<Mutex<bool>>,
    pub(crate) latch: Arc<StopLatch>,
}

impl MachineHandle {
    /// Ends the run where the guest is: [`crate::Machine::run`] returns
    /// [`crate::RunError::Stopped`]. For an owner that gives up on a guest
    /// before its time limit (a test that sees a stalled CPU in its log).
    /// Returns false when the VM had already stopped.
    pub fn stop(&self) -> bool {
        self.latch.stop(StopReason::Requested)
    }

    /// Parks every vCPU and stops every device worker, so guest memory and
    /// device state stay still. A no-op on a paused VM.
    pub fn pause(&self) -> Result<(), SnapshotError> {
        let mut devices_paused = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        self.pause_locked(&mut devices_paused)
    }

    fn pause_locked(&self, devices_paused: &mut bool) -> Result<(), SnapshotError> {
        self.control.pause()?;
        if !*devices_paused {
            for t in &self.virtio {
                lock(t).pause_device()?;
            }
            *devices_paused = true;
        }
        Ok(())
    }

    /// Restarts device workers and lets the vCPUs run. A no-op on a running VM.
    pub fn resume(&self) -> Result<(), SnapshotError> {
        let mut devices_paused = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        if *devices_paused {
            for t in &self.virtio {
                lock(t).resume_device()?;
            }
            *devices_paused = false;
        }
        self.control.resume();
        Ok(())
    }

    /// Puts the read-only `file` into disk slot `disk_number` (counted in
    /// `--disk` order), or empties the slot (`None`), while the guest runs
    /// or is paused; returns the slot's new size in sectors.
    pub fn change_medium(
        &self,
        disk_number: usize,
        file: Option<std::fs::File>,
    ) -> Result<u64, MediumError> {
        let _serialised = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        let transport = self
            .virtio
            .iter()
            .filter(|t| lock(t).device().as_block().is_some())
            .nth(disk_number)
            .ok_or(MediumError::NoSuchDisk(disk_number))?;
        lock(transport).change_medium(disk_number, file)
    }

    /// Whether the VM is paused.
    pub fn is_paused(&self) -> bool {
        self.control.is_paused()
    }

    /// Pauses the VM (if running) and writes a snapshot into `dir`, which
    /// must exist and be empty. The VM stays paused.
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotReport, SnapshotError> {
        let started = Instant::now();
        snapshot::check_directory(dir)?;
        let mut devices_paused = self.op.lock().unwrap_or_else(PoisonError::into_inner);
        // A snapshot reopens its disks from the restore's --disk list, which
        // cannot name a medium handed in later (checked under `op`, which
        // medium changes take too).
        if let Some(id) = self.virtio.iter().find_map(|t| {
            let t = lock(t);
            let block = t.device().as_block()?;
            block.slot_holds_disk().then(|| block.id().to_owned())
        }) {
            return Err(SnapshotError::SlotInUse(id));
        }
        self.pause_locked(&mut devices_paused)?;
        let vcpus = self.control.save_vcpus()?;
        let virtio: Vec<_> = self.virtio.iter().map(|t| lock(t).snapshot()).collect();
        let serial = self
            .serial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state();
        let paused = PausedVm {
            config: SavedConfig {
                mem_mib: self.mem_mib,
                vcpus: self.vcpus,
                devices: snapshot::saved_devices(&virtio),
            },
            vm: &self.vm,
            mem: &self.mem,
            vcpus,
            serial,
            virtio,
        };
        snapshot::write_snapshot(paused, dir, started)
    }
}
