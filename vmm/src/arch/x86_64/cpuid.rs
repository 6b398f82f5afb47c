//! Per-vCPU CPUID: what KVM supports on this host, with each vCPU's APIC ID and
//! the vCPU count patched in, so a guest (Linux's SMP bring-up in particular)
//! finds the CPUs it was given. Cache/core topology leaves are passed through
//! as KVM reports them; describing a socket/core layout is not done yet.

use kvm_bindings::CpuId;

/// Leaf 1: feature flags, APIC ID, logical processor count.
const LEAF_FEATURES: u32 = 0x1;
/// Leaves 0xb and 0x1f: extended topology; EDX holds the x2APIC ID.
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;

const EBX_APIC_ID_SHIFT: u32 = 24;
const EBX_LOGICAL_COUNT_SHIFT: u32 = 16;
const EBX_CLFLUSH_MASK: u32 = 0x0000_ff00;
/// Leaf 1 EDX: HTT, "the logical processor count field is valid".
const EDX_HTT: u32 = 1 << 28;
/// Leaf 1 ECX: running under a hypervisor.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 ECX: the local APIC timer has a TSC-deadline mode.
const ECX_TSC_DEADLINE_TIMER: u32 = 1 << 24;

/// Adds the TSC-deadline timer to `supported` where KVM emulates it
/// (`KVM_CAP_TSC_DEADLINE_TIMER`): KVM_GET_SUPPORTED_CPUID leaves it out and
/// expects the VMM to add it. Without it a Linux guest calibrates its APIC
/// timer against the PIT at boot, waiting out a tenth of a second of ticks
/// (`calibrate_APIC_clock`); with it, the timer counts in TSC units that
/// kvmclock already knows.
pub fn offer_tsc_deadline_timer(supported: &mut CpuId) {
    for entry in supported.as_mut_slice() {
        if entry.function == LEAF_FEATURES {
            entry.ecx |= ECX_TSC_DEADLINE_TIMER;
        }
    }
}

/// The CPUID for vCPU `vcpu_id` of `vcpu_count`, derived from `supported`
/// (KVM_GET_SUPPORTED_CPUID).
pub fn vcpu_cpuid(supported: &CpuId, vcpu_id: u8, vcpu_count: u8) -> CpuId {
    let mut cpuid = supported.clone();
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            LEAF_FEATURES => {
                entry.ebx = (u32::from(vcpu_id) << EBX_APIC_ID_SHIFT)
                    | (u32::from(vcpu_count) << EBX_LOGICAL_COUNT_SHIFT)
                    | (entry.ebx & EBX_CLFLUSH_MASK);
                entry.ecx |= ECX_HYPERVISOR;
                if vcpu_count > 1 {
                    entry.edx |= EDX_HTT;
                } else {
                    entry.edx &= !EDX_HTT;
                }
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => entry.edx = u32::from(vcpu_id),
            _ => {}
        }
    }
    cpuid
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn patches_apic_id_and_count() {
        let supported = CpuId::from_entries(&[
            kvm_cpuid_entry2 {
                function: LEAF_FEATURES,
                ebx: 0xffff_0800,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: LEAF_EXT_TOPOLOGY,
                ..Default::default()
            },
        ])
        .expect("two entries fit");
        let cpuid = vcpu_cpuid(&supported, 3, 4);
        let leaf1 = cpuid.as_slice()[0];
        assert_eq!(leaf1.ebx, 0x0304_0800);
        assert_ne!(leaf1.ecx & ECX_HYPERVISOR, 0);
        assert_ne!(leaf1.edx & EDX_HTT, 0);
        assert_eq!(cpuid.as_slice()[1].edx, 3);
    }

    #[test]
    fn the_tsc_deadline_timer_is_offered_in_leaf_1_only() {
        let mut supported = CpuId::from_entries(&[
            kvm_cpuid_entry2 {
                function: LEAF_FEATURES,
                ecx: 0x1,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: LEAF_EXT_TOPOLOGY,
                ..Default::default()
            },
        ])
        .expect("two entries fit");
        offer_tsc_deadline_timer(&mut supported);
        assert_eq!(supported.as_slice()[0].ecx, 0x1 | ECX_TSC_DEADLINE_TIMER);
        assert_eq!(supported.as_slice()[1].ecx, 0);
        // And it survives the per-vCPU patching.
        let leaf1 = vcpu_cpuid(&supported, 0, 1).as_slice()[0];
        assert_ne!(leaf1.ecx & ECX_TSC_DEADLINE_TIMER, 0);
    }
}
