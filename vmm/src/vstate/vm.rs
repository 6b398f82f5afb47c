//! The KVM VM: its guest memory slots, the in-kernel irqchip (PIC, IOAPIC,
//! LAPICs) and PIT, which Linux needs and which keep interrupt and timer
//! traffic out of the VMM, and the irq lines (irqfd) of devices.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_config, kvm_pit_state2, kvm_userspace_memory_region,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{IoEventAddress, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::kvm::KvmContext;
use crate::arch::layout::KVM_TSS_ADDRESS;

/// Failures creating or setting up the VM; each names the KVM ioctl.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// KVM_CREATE_VM failed.
    #[error("KVM_CREATE_VM failed (out of memory, or KVM is unusable on this host): {0}")]
    Create(#[source] kvm_ioctls::Error),
    /// KVM_SET_TSS_ADDR failed.
    #[error("KVM_SET_TSS_ADDR failed: {0}")]
    TssAddress(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_IRQCHIP failed.
    #[error("KVM_CREATE_IRQCHIP failed: {0}")]
    Irqchip(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_PIT2 failed.
    #[error("KVM_CREATE_PIT2 failed: {0}")]
    Pit(#[source] kvm_ioctls::Error),
    /// More memory regions than KVM slots.
    #[error("guest memory has more regions than KVM memory slots")]
    TooManyRegions,
    /// KVM_SET_USER_MEMORY_REGION failed.
    #[error("KVM_SET_USER_MEMORY_REGION failed for slot {slot}: {source}")]
    MemoryRegion {
        /// The slot.
        slot: u32,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_IOEVENTFD failed.
    #[error("KVM_IOEVENTFD failed for MMIO address {addr:#x}: {source}")]
    Ioeventfd {
        /// The guest-physical address.
        addr: u64,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_IRQFD failed.
    #[error("KVM_IRQFD failed for GSI {gsi}: {source}")]
    Irqfd {
        /// The interrupt line.
        gsi: u32,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// Version of [`VmState`]'s layout.
pub const VM_STATE_VERSION: u32 = 1;

/// The in-kernel devices' state of a paused VM: the interrupt controllers,
/// the PIT and the KVM clock (each vCPU's LAPIC is in its `VcpuState`).
#[derive(Debug, Serialize, Deserialize)]
pub struct VmState {
    /// [`VM_STATE_VERSION`].
    pub version: u32,
    /// PIC master, PIC slave, IOAPIC (KVM_GET_IRQCHIP), in that order.
    pub irqchips: Vec<kvm_irqchip>,
    /// KVM_GET_PIT2.
    pub pit: kvm_pit_state2,
    /// KVM_GET_CLOCK.
    pub clock: kvm_clock_data,
}

/// Failures saving or restoring [`VmState`]; each names the ioctl.
#[derive(Debug, thiserror::Error)]
pub enum VmStateError {
    /// A KVM_GET_* call failed.
    #[error("cannot save the VM's interrupt controller/timer state: {what} failed: {source}")]
    Save {
        /// The ioctl.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A KVM_SET_* call failed (the saved values are refused by this KVM).
    #[error("cannot restore the VM's interrupt controller/timer state: {what} failed: {source}")]
    Restore {
        /// The ioctl.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The state is not what this vmm writes.
    #[error("saved VM state is invalid: {0}; the snapshot is corrupt or from another vmm")]
    Invalid(String),
}

const IRQCHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

/// A KVM VM with its irqchip and PIT.
#[derive(Debug)]
pub struct Vm {
    fd: VmFd,
}

impl Vm {
    /// Creates the VM with `mem` as its RAM, then its irqchip and PIT.
    ///
    /// The order matters. Memory slots go in before the irqchip: once the
    /// in-kernel irqchip exists, KVM_SET_USER_MEMORY_REGION got much slower on
    /// the kvm_pvm development host (4-8 ms per call against ~0.2 ms before;
    /// an SRCU grace period, most likely), which was most of the time to the
    /// guest's first line. The irqchip must exist before any vCPU is created,
    /// so it is done here too.
    pub fn new(kvm: &KvmContext, mem: &GuestMemoryMmap) -> Result<Self, VmError> {
        let fd = kvm.kvm().create_vm().map_err(VmError::Create)?;
        fd.set_tss_address(KVM_TSS_ADDRESS as usize)
            .map_err(VmError::TssAddress)?;
        let vm = Vm { fd };
        vm.register_memory(mem)?;
        vm.fd.create_irq_chip().map_err(VmError::Irqchip)?;
        // A dummy speaker: port 0x61 is then answered in the kernel.
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm.fd.create_pit2(pit).map_err(VmError::Pit)?;
        Ok(vm)
    }

    /// Registers every region of `mem` as a KVM memory slot (slot = index).
    /// `mem` must outlive the VM's use of it: callers keep both together.
    fn register_memory(&self, mem: &GuestMemoryMmap) -> Result<(), VmError> {
        for (index, region) in mem.iter().enumerate() {
            let slot = u32::try_from(index).map_err(|_| VmError::TooManyRegions)?;
            let region = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: region.start_addr().raw_value(),
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            // SAFETY: the host range comes from a live mapping of exactly
            // `memory_size` bytes owned by `mem`, which the caller keeps alive
            // as long as the VM (both live in `Machine`), and slots do not
            // overlap because `mem`'s regions do not.
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(|source| VmError::MemoryRegion { slot, source })?;
        }
        Ok(())
    }

    /// Makes a write to `evt` raise interrupt line `gsi`.
    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(|source| VmError::Irqfd { gsi, source })
    }

    /// Makes a 4-byte guest write of `value` to MMIO address `addr` signal
    /// `evt` inside KVM, without an exit to the VMM (virtio QueueNotify).
    pub fn register_ioevent(&self, evt: &EventFd, addr: u64, value: u32) -> Result<(), VmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), value)
            .map_err(|source| VmError::Ioeventfd { addr, source })
    }

    /// Saves the irqchip, PIT and clock. The vCPUs must be paused.
    pub fn save_state(&self) -> Result<VmState, VmStateError> {
        let save = |what| move |source| VmStateError::Save { what, source };
        let irqchips = IRQCHIPS
            .iter()
            .map(|&chip_id| {
                let mut chip = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                self.fd
                    .get_irqchip(&mut chip)
                    .map(|()| chip)
                    .map_err(save("KVM_GET_IRQCHIP"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VmState {
            version: VM_STATE_VERSION,
            irqchips,
            pit: self.fd.get_pit2().map_err(save("KVM_GET_PIT2"))?,
            clock: self.fd.get_clock().map_err(save("KVM_GET_CLOCK"))?,
        })
    }

    /// Loads `state` (before any vCPU runs, as Firecracker does: PIT,
    /// clock, then the interrupt controllers).
    pub fn restore_state(&self, state: &VmState) -> Result<(), VmStateError> {
        if state.version != VM_STATE_VERSION {
            return Err(VmStateError::Invalid(format!(
                "version {}, this vmm reads {VM_STATE_VERSION}",
                state.version
            )));
        }
        let ids: Vec<u32> = state.irqchips.iter().map(|c| c.chip_id).collect();
        if ids != IRQCHIPS {
            return Err(VmStateError::Invalid(format!(
                "irqchips {ids:?}, expected PIC master, PIC slave, IOAPIC {IRQCHIPS:?}"
            )));
        }
        let restore = |what| move |source| VmStateError::Restore { what, source };
        self.fd
            .set_pit2(&state.pit)
            .map_err(restore("KVM_SET_PIT2"))?;
        // Flags describe how the clock was read (TSC-stable, realtime);
        // with none, KVM sets the guest's clock to exactly the saved value, so
        // guest time continues from the snapshot instead of jumping by the
        // time the snapshot sat on disk.
        let clock = kvm_clock_data {
            flags: 0,
            ..state.clock
        };
        self.fd
            .set_clock(&clock)
            .map_err(restore("KVM_SET_CLOCK"))?;
        for chip in &state.irqchips {
            self.fd
                .set_irqchip(chip)
                .map_err(restore("KVM_SET_IRQCHIP"))?;
        }
        Ok(())
    }

    /// The VM file descriptor.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }
}
