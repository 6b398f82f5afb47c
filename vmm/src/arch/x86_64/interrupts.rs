//! Local APIC wiring at boot: LINT0 as ExtINT (the PIC's output, which Linux
//! uses until it switches to the IOAPIC) and LINT1 as NMI, as the MP spec's
//! virtual-wire mode has it and as firmware would leave it.

use kvm_bindings::kvm_lapic_state;
use kvm_ioctls::VcpuFd;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;
const DELIVERY_MODE_MASK: u32 = 0x700;

/// Failures reading or writing the in-kernel LAPIC.
#[derive(Debug, thiserror::Error)]
pub enum InterruptsError {
    /// KVM_GET_LAPIC failed.
    #[error("KVM_GET_LAPIC failed (is the in-kernel irqchip created?): {0}")]
    GetLapic(#[source] kvm_ioctls::Error),
    /// KVM_SET_LAPIC failed.
    #[error("KVM_SET_LAPIC failed: {0}")]
    SetLapic(#[source] kvm_ioctls::Error),
}

fn reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = |i: usize| lapic.regs[offset + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

fn set_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().into_iter().enumerate() {
        lapic.regs[offset + i] = byte as i8;
    }
}

fn with_delivery_mode(lvt: u32, mode: u32) -> u32 {
    (lvt & !DELIVERY_MODE_MASK) | (mode << 8)
}

/// Sets LINT0 to ExtINT and LINT1 to NMI on `vcpu`'s LAPIC.
pub fn set_lint(vcpu: &VcpuFd) -> Result<(), InterruptsError> {
    let mut lapic = vcpu.get_lapic().map_err(InterruptsError::GetLapic)?;
    let lvt0 = reg(&lapic, APIC_LVT0);
    set_reg(
        &mut lapic,
        APIC_LVT0,
        with_delivery_mode(lvt0, APIC_MODE_EXTINT),
    );
    let lvt1 = reg(&lapic, APIC_LVT1);
    set_reg(
        &mut lapic,
        APIC_LVT1,
        with_delivery_mode(lvt1, APIC_MODE_NMI),
    );
    vcpu.set_lapic(&lapic).map_err(InterruptsError::SetLapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_mode_replaces_only_its_bits() {
        assert_eq!(
            with_delivery_mode(0x0001_0000, APIC_MODE_EXTINT),
            0x0001_0700
        );
        assert_eq!(with_delivery_mode(0x0001_0700, APIC_MODE_NMI), 0x0001_0400);
    }

    #[test]
    fn register_access_is_little_endian() {
        let mut lapic = kvm_lapic_state::default();
        set_reg(&mut lapic, APIC_LVT1, 0x1234_5678);
        assert_eq!(lapic.regs[APIC_LVT1] as u8, 0x78);
        assert_eq!(reg(&lapic, APIC_LVT1), 0x1234_5678);
    }
}
