//! Model-specific registers: the values set at boot (as Firecracker does, so
//! Linux starts from a defined state rather than KVM's zeroes where it matters),
//! and the list of MSRs saved in a vCPU's state.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_TSC_AUX: u32 = 0xc000_0103;
const MSR_IA32_CR_PAT: u32 = 0x277;
const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
const MSR_KVM_WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
const MSR_KVM_ASYNC_PF_EN: u32 = 0x4b56_4d02;
const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
const MSR_KVM_POLL_CONTROL: u32 = 0x4b56_4d05;
const MSR_KVM_ASYNC_PF_INT: u32 = 0x4b56_4d06;

/// MISC_ENABLE: fast string operations (REP MOVS/STOS) enabled, as firmware
/// leaves it.
const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRR default type: MTRRs enabled, default memory type write-back.
const MTRR_ENABLE_WRITE_BACK: u64 = (1 << 11) | 6;

/// The TSC MSR index: the one saved MSR whose value moves on its own.
pub const TSC: u32 = MSR_IA32_TSC;

/// MSRs a vCPU's saved state carries. Not yet the full list KVM reports
/// (KVM_GET_MSR_INDEX_LIST); the snapshot work extends it.
pub const SAVED_MSRS: [u32; 11] = [
    MSR_IA32_TSC,
    MSR_IA32_SYSENTER_CS,
    MSR_IA32_SYSENTER_ESP,
    MSR_IA32_SYSENTER_EIP,
    MSR_IA32_MISC_ENABLE,
    MSR_MTRR_DEF_TYPE,
    MSR_STAR,
    MSR_LSTAR,
    MSR_CSTAR,
    MSR_SYSCALL_MASK,
    MSR_KERNEL_GS_BASE,
];

/// MSRs saved where this host's KVM has them, after [`SAVED_MSRS`] and in
/// the order they are restored. A Linux guest needs them to go on after a
/// restore: kvmclock and PV EOI tell KVM where the guest reads the time and
/// acknowledges interrupts (without them a fork's clock stands still and
/// its first interrupt is its last), TSC_AUX is the vDSO's CPU number, and
/// the TSC deadline timer (set after the TSC it counts in) is the next timer
/// interrupt. Async PF's interrupt vector comes before it is enabled.
pub const GUEST_MSRS: [u32; 10] = [
    MSR_IA32_CR_PAT,
    MSR_TSC_AUX,
    MSR_KVM_WALL_CLOCK_NEW,
    MSR_KVM_SYSTEM_TIME_NEW,
    MSR_KVM_STEAL_TIME,
    MSR_KVM_PV_EOI_EN,
    MSR_KVM_POLL_CONTROL,
    MSR_KVM_ASYNC_PF_INT,
    MSR_KVM_ASYNC_PF_EN,
    MSR_IA32_TSC_DEADLINE,
];

/// Failures reading or writing MSRs.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// The entry list did not fit KVM's limit (a bug: the lists are fixed).
    #[error("too many MSR entries for one KVM call")]
    TooMany,
    /// KVM_SET_MSRS failed outright.
    #[error("KVM_SET_MSRS failed: {0}")]
    Set(#[source] kvm_ioctls::Error),
    /// KVM_SET_MSRS stopped at an MSR it refused.
    #[error(
        "KVM refused MSR {index:#x} (set {done} of {total}); this host's KVM does not support it"
    )]
    Refused {
        /// The refused MSR.
        index: u32,
        /// How many were set before it.
        done: usize,
        /// How many were asked for.
        total: usize,
    },
    /// KVM_GET_MSRS failed outright.
    #[error("KVM_GET_MSRS failed: {0}")]
    Get(#[source] kvm_ioctls::Error),
    /// KVM_GET_MSRS stopped at an MSR it cannot read.
    #[error("KVM cannot read MSR {index:#x}; this host's KVM does not support it")]
    Unreadable {
        /// The MSR.
        index: u32,
    },
}

fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WRITE_BACK),
    ]
}

/// Writes `entries`; every one must be accepted.
pub fn set_msrs(vcpu: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<(), MsrError> {
    let msrs = Msrs::from_entries(entries).map_err(|_| MsrError::TooMany)?;
    let done = vcpu.set_msrs(&msrs).map_err(MsrError::Set)?;
    if done != entries.len() {
        return Err(MsrError::Refused {
            index: entries.get(done).map_or(0, |e| e.index),
            done,
            total: entries.len(),
        });
    }
    Ok(())
}

/// Writes the boot MSR values.
pub fn setup_boot_msrs(vcpu: &VcpuFd) -> Result<(), MsrError> {
    set_msrs(vcpu, &boot_msr_entries())
}

/// Reads the [`SAVED_MSRS`], then whichever [`GUEST_MSRS`] KVM has here.
pub fn get_saved_msrs(vcpu: &VcpuFd) -> Result<Vec<kvm_msr_entry>, MsrError> {
    let mut saved = get_required_msrs(vcpu)?;
    for index in GUEST_MSRS {
        let mut one = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .map_err(|_| MsrError::TooMany)?;
        // A read KVM refuses (0 entries read) means this host's KVM does not
        // emulate it, so neither has the guest used it.
        if vcpu.get_msrs(&mut one).map_err(MsrError::Get)? == 1 {
            saved.extend_from_slice(one.as_slice());
        }
    }
    Ok(saved)
}

fn get_required_msrs(vcpu: &VcpuFd) -> Result<Vec<kvm_msr_entry>, MsrError> {
    let entries: Vec<kvm_msr_entry> = SAVED_MSRS
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut msrs = Msrs::from_entries(&entries).map_err(|_| MsrError::TooMany)?;
    let done = vcpu.get_msrs(&mut msrs).map_err(MsrError::Get)?;
    if done != entries.len() {
        return Err(MsrError::Unreadable {
            index: SAVED_MSRS.get(done).copied().unwrap_or(0),
        });
    }
    Ok(msrs.as_slice().to_vec())
}
