//! Boot register state of the boot vCPU, one of two entries:
//! - 64-bit long mode (the test guest, Linux's 64-bit boot protocol): paging
//!   on with the boot page tables, flat segments from the boot GDT, `%rdi`
//!   and `%rsi` pointing at the boot-info block or the zero page;
//! - PVH: 32-bit protected mode, paging off, flat 32-bit segments from the
//!   PVH GDT, `%ebx` pointing at `hvm_start_info`.
//!
//! Interrupts are off in both. Application processors are not touched: they
//! wait for INIT/SIPI in the in-kernel LAPIC, as on hardware.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;

use super::gdt::{self, BOOT_GDT, CODE_INDEX, DATA_INDEX, PVH_GDT, TSS_INDEX};
use super::layout::{BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PML4_START};

const X86_CR0_PE: u64 = 1 << 0;
/// CR0.ET: hardwired to 1 on every CPU since the 486.
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// Bit 1 of RFLAGS is reserved and always set.
const RFLAGS_RESERVED: u64 = 1 << 1;

/// Failures loading the boot registers; each names the KVM ioctl that failed.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// KVM_GET_SREGS failed.
    #[error("KVM_GET_SREGS failed: {0}")]
    GetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_SREGS failed.
    #[error("KVM_SET_SREGS failed (the host may not support 64-bit guests): {0}")]
    SetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_REGS failed.
    #[error("KVM_SET_REGS failed: {0}")]
    SetRegs(#[source] kvm_ioctls::Error),
    /// KVM_SET_FPU failed.
    #[error("KVM_SET_FPU failed: {0}")]
    SetFpu(#[source] kvm_ioctls::Error),
}

/// Where and how the boot vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootEntry {
    /// 64-bit long mode at `entry`, `%rdi` = `%rsi` = `params` (the
    /// boot-info block, or Linux's zero page).
    LongMode {
        /// The 64-bit entry point.
        entry: u64,
        /// Address of the boot parameters.
        params: u64,
    },
    /// PVH: 32-bit protected mode at `entry`, `%ebx` = `start_info`.
    Pvh {
        /// The PHYS32_ENTRY address.
        entry: u64,
        /// Address of `hvm_start_info`.
        start_info: u64,
    },
}

/// General-purpose registers at the PVH entry point.
pub fn pvh_regs(entry: u64, start_info: u64) -> kvm_regs {
    kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip: entry,
        rbx: start_info,
        ..Default::default()
    }
}

/// Turns the reset-state `sregs` into flat 32-bit protected mode without
/// paging, the state the PVH ABI specifies.
pub fn pvh_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = gdt::kvm_segment_from_gdt(PVH_GDT[usize::from(CODE_INDEX)], CODE_INDEX);
    let data = gdt::kvm_segment_from_gdt(PVH_GDT[usize::from(DATA_INDEX)], DATA_INDEX);
    let tss = gdt::kvm_segment_from_gdt(PVH_GDT[usize::from(TSS_INDEX)], TSS_INDEX);

    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&PVH_GDT) - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = (std::mem::size_of::<u64>() - 1) as u16;

    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// General-purpose registers at the 64-bit entry point.
pub fn boot_regs(entry: u64, boot_info: u64) -> kvm_regs {
    kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        // The test guest's `_start(const struct boot_info *)` reads %rdi (SysV
        // ABI); Linux's 64-bit protocol reads %rsi. Both get the pointer.
        rdi: boot_info,
        rsi: boot_info,
        ..Default::default()
    }
}

/// Turns the reset-state `sregs` into 64-bit long mode on the boot tables.
pub fn long_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = gdt::kvm_segment_from_gdt(BOOT_GDT[usize::from(CODE_INDEX)], CODE_INDEX);
    let data = gdt::kvm_segment_from_gdt(BOOT_GDT[usize::from(DATA_INDEX)], DATA_INDEX);
    let tss = gdt::kvm_segment_from_gdt(BOOT_GDT[usize::from(TSS_INDEX)], TSS_INDEX);

    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&BOOT_GDT) - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = (std::mem::size_of::<u64>() - 1) as u16;

    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// x87/SSE control words as after FNINIT and at SSE reset: all exceptions
/// masked. KVM's reset state leaves them zero, which unmasks every exception.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

/// Loads the boot state for `boot` into the boot vCPU.
pub fn setup_boot_vcpu(vcpu: &VcpuFd, boot: BootEntry) -> Result<(), RegsError> {
    let sregs = vcpu.get_sregs().map_err(RegsError::GetSregs)?;
    let (sregs, regs) = match boot {
        BootEntry::LongMode { entry, params } => (long_mode_sregs(sregs), boot_regs(entry, params)),
        BootEntry::Pvh { entry, start_info } => (pvh_sregs(sregs), pvh_regs(entry, start_info)),
    };
    vcpu.set_sregs(&sregs).map_err(RegsError::SetSregs)?;
    vcpu.set_regs(&regs).map_err(RegsError::SetRegs)?;
    vcpu.set_fpu(&boot_fpu()).map_err(RegsError::SetFpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_sregs_enable_paging_and_lma() {
        let s = long_mode_sregs(kvm_sregs::default());
        assert_eq!(s.cr0 & (X86_CR0_PE | X86_CR0_PG), X86_CR0_PE | X86_CR0_PG);
        assert_ne!(s.cr4 & X86_CR4_PAE, 0);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4_START);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.gdt.limit, 31);
    }

    #[test]
    fn pvh_sregs_are_32_bit_protected_mode_without_paging() {
        let reset = kvm_sregs {
            cr0: 0x6000_0010,
            ..Default::default()
        };
        let s = pvh_sregs(reset);
        assert_eq!(s.cr0, X86_CR0_PE | X86_CR0_ET, "PG, CD and NW off");
        assert_eq!((s.cr3, s.cr4, s.efer), (0, 0, 0));
        assert_eq!((s.cs.l, s.cs.db, s.cs.selector), (0, 1, 0x08));
        assert_eq!((s.ss.db, s.ds.selector), (1, 0x10));
        assert_eq!((s.tr.limit, s.tr.type_), (0x67, 0xb));
        let r = pvh_regs(0x100_0850, 0x6000);
        assert_eq!((r.rip, r.rbx, r.rflags), (0x100_0850, 0x6000, 2));
    }

    #[test]
    fn boot_regs_point_at_entry_and_boot_info() {
        let r = boot_regs(0x10_0000, 0x6000);
        assert_eq!(
            (r.rip, r.rdi, r.rsi, r.rflags),
            (0x10_0000, 0x6000, 0x6000, 2)
        );
    }
}
