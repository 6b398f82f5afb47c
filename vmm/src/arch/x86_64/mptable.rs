//! The MP table (Intel MultiProcessor Specification 1.4), the way a Linux
//! guest without ACPI finds its CPUs and interrupt routing: one processor
//! entry per vCPU (APIC ID = vCPU id, vCPU 0 the bootstrap processor), one
//! ISA bus, KVM's in-kernel IOAPIC, every IOAPIC pin wired to the same ISA
//! IRQ number (KVM's default GSI routing), and the LAPICs' LINT0 = ExtINT,
//! LINT1 = NMI (as `interrupts::set_lint` programs them). Linux reads it only
//! when built with CONFIG_X86_MPPARSE; without it (and without ACPI) it
//! brings up the boot CPU alone.
//!
//! The floating pointer sits at [`MPTABLE_START`], in the last KiB below
//! 640 KiB where Linux searches, and the configuration table right after it.
//! Both are built as byte strings, so no packed structs are needed.

use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::layout::{APIC_START, IOAPIC_START, MPTABLE_START};

/// IOAPIC pins of KVM's in-kernel IOAPIC.
pub const IOAPIC_PINS: u8 = 24;

const SPEC_REV_1_4: u8 = 4;
const FLOATING_POINTER_LEN: usize = 16;
const CONFIG_HEADER_LEN: usize = 44;
const PROCESSOR_ENTRY_LEN: usize = 20;
const SHORT_ENTRY_LEN: usize = 8;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;

const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;
/// Family 6 in the CPU signature; Linux does not use it beyond printing.
const CPU_SIGNATURE: u32 = 0x600;
/// Feature flags: FPU and on-chip APIC.
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);
/// The version KVM's LAPIC reports.
const APIC_VERSION: u8 = 0x14;
/// The version KVM's IOAPIC reports.
const IOAPIC_VERSION: u8 = 0x11;
const IOAPIC_ENABLED: u8 = 1;

const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
/// Polarity and trigger "conform to the bus": edge, active high on ISA.
const INT_FLAGS_CONFORM: u16 = 0;
/// Destination "all local APICs".
const ALL_APICS: u8 = 0xff;

const ISA_BUS_ID: u8 = 0;

/// Bytes the whole table takes for `vcpus` vCPUs.
pub fn mptable_len(vcpus: u8) -> usize {
    FLOATING_POINTER_LEN + CONFIG_HEADER_LEN + config_entries_len(vcpus)
}

fn config_entries_len(vcpus: u8) -> usize {
    usize::from(vcpus) * PROCESSOR_ENTRY_LEN + (2 + usize::from(IOAPIC_PINS) + 2) * SHORT_ENTRY_LEN
}

/// Entries in the configuration table for `vcpus` vCPUs.
pub fn mptable_entry_count(vcpus: u8) -> u16 {
    // Processors, the bus, the IOAPIC, one per pin, LINT0 and LINT1.
    u16::from(vcpus) + 2 + u16::from(IOAPIC_PINS) + 2
}

/// The byte that makes `bytes` sum to zero (mod 256).
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, b| sum.wrapping_add(*b))
        .wrapping_neg()
}

fn interrupt_entry(kind: u8, int_type: u8, bus_irq: u8, dest: u8, dest_pin: u8) -> [u8; 8] {
    let flags = INT_FLAGS_CONFORM.to_le_bytes();
    [
        kind, int_type, flags[0], flags[1], ISA_BUS_ID, bus_irq, dest, dest_pin,
    ]
}

/// The table for `vcpus` vCPUs (1 or more), as it is written at
/// [`MPTABLE_START`].
pub fn mptable(vcpus: u8) -> Vec<u8> {
    let ioapic_id = vcpus; // APIC IDs 0..vcpus are the CPUs'.
    let config_addr = MPTABLE_START + FLOATING_POINTER_LEN as u64;

    let mut entries = Vec::with_capacity(config_entries_len(vcpus));
    for id in 0..vcpus {
        entries.extend_from_slice(&[ENTRY_PROCESSOR, id, APIC_VERSION]);
        entries.push(CPU_ENABLED | if id == 0 { CPU_BOOTSTRAP } else { 0 });
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0; 8]);
    }
    entries.extend_from_slice(&[ENTRY_BUS, ISA_BUS_ID]);
    entries.extend_from_slice(b"ISA   ");
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, IOAPIC_ENABLED]);
    // IOAPIC_START is a 32-bit address.
    entries.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    for pin in 0..IOAPIC_PINS {
        entries.extend_from_slice(&interrupt_entry(
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            pin,
            ioapic_id,
            pin,
        ));
    }
    entries.extend_from_slice(&interrupt_entry(
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_EXTINT,
        0,
        ALL_APICS,
        0,
    ));
    entries.extend_from_slice(&interrupt_entry(
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_NMI,
        0,
        ALL_APICS,
        1,
    ));

    // At most 254 x 20 + 28 x 8 bytes: fits the header's u16 length.
    let base_len = (CONFIG_HEADER_LEN + entries.len()) as u16;
    let mut config = Vec::with_capacity(usize::from(base_len));
    config.extend_from_slice(b"PCMP");
    config.extend_from_slice(&base_len.to_le_bytes());
    config.push(SPEC_REV_1_4);
    config.push(0); // checksum, below
    config.extend_from_slice(b"SANDBOXD"); // OEM ID, 8 bytes
    config.extend_from_slice(b"MICROVM     "); // product ID, 12 bytes
    config.extend_from_slice(&0u32.to_le_bytes()); // no OEM table
    config.extend_from_slice(&0u16.to_le_bytes());
    config.extend_from_slice(&mptable_entry_count(vcpus).to_le_bytes());
    config.extend_from_slice(&(APIC_START as u32).to_le_bytes());
    config.extend_from_slice(&0u16.to_le_bytes()); // no extended table
    config.extend_from_slice(&[0, 0]); // its checksum, reserved
    config.extend_from_slice(&entries);
    config[7] = checksum(&config);

    let mut table = Vec::with_capacity(mptable_len(vcpus));
    table.extend_from_slice(b"_MP_");
    // The configuration table lies below 1 MiB.
    table.extend_from_slice(&(config_addr as u32).to_le_bytes());
    table.push(1); // length in 16-byte units
    table.push(SPEC_REV_1_4);
    table.push(0); // checksum, below
    table.extend_from_slice(&[0; 5]); // feature bytes: a configuration table follows
    table[10] = checksum(&table);
    table.extend_from_slice(&config);
    table
}

/// Writes the MP table for `vcpus` vCPUs at [`MPTABLE_START`].
pub fn write_mptable(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), GuestMemoryError> {
    mem.write_slice(&mptable(vcpus), GuestAddress(MPTABLE_START))
}

#[cfg(test)]
mod tests {
    use super::super::layout::HIMEM_START;
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    #[test]
    fn checksums_lengths_and_entry_count() {
        for vcpus in [1u8, 2, 8, 254] {
            let t = mptable(vcpus);
            assert_eq!(t.len(), mptable_len(vcpus));
            let (fp, config) = t.split_at(FLOATING_POINTER_LEN);
            assert_eq!(&fp[..4], b"_MP_");
            assert_eq!(sum(fp), 0, "floating pointer checksum, {vcpus} vCPUs");
            let addr = u32::from_le_bytes([fp[4], fp[5], fp[6], fp[7]]);
            assert_eq!(u64::from(addr), MPTABLE_START + 16);
            assert_eq!(&config[..4], b"PCMP");
            assert_eq!(usize::from(u16_at(config, 4)), config.len());
            assert_eq!(
                sum(config),
                0,
                "configuration table checksum, {vcpus} vCPUs"
            );
            assert_eq!(u16_at(config, 34), u16::from(vcpus) + 28);
            // The table stays in the reserved area below 1 MiB.
            assert!(MPTABLE_START + t.len() as u64 <= HIMEM_START);
        }
    }

    #[test]
    fn one_processor_entry_per_vcpu_and_only_vcpu_0_boots() {
        let t = mptable(4);
        let entries = &t[FLOATING_POINTER_LEN + CONFIG_HEADER_LEN..];
        for id in 0..4u8 {
            let e = &entries[usize::from(id) * PROCESSOR_ENTRY_LEN..][..PROCESSOR_ENTRY_LEN];
            assert_eq!(e[0], ENTRY_PROCESSOR);
            assert_eq!(e[1], id, "APIC ID");
            let flags = if id == 0 { 3 } else { 1 };
            assert_eq!(e[3], flags, "vCPU {id}");
        }
        let rest = &entries[4 * PROCESSOR_ENTRY_LEN..];
        assert_eq!(
            &rest[..8],
            &[ENTRY_BUS, 0, b'I', b'S', b'A', b' ', b' ', b' ']
        );
        assert_eq!(&rest[8..12], &[ENTRY_IOAPIC, 4, IOAPIC_VERSION, 1]);
        assert_eq!(&rest[12..16], &0xfec0_0000u32.to_le_bytes());
        // Pin 5 (the first virtio device's GSI) is ISA IRQ 5.
        let pin5 = &rest[16 + 5 * 8..][..8];
        assert_eq!(pin5, &[ENTRY_IO_INTERRUPT, INT_TYPE_INT, 0, 0, 0, 5, 4, 5]);
        let lint = &rest[16 + 24 * 8..];
        assert_eq!(lint.len(), 16);
        assert_eq!((lint[1], lint[7]), (INT_TYPE_EXTINT, 0));
        assert_eq!((lint[9], lint[15]), (INT_TYPE_NMI, 1));
    }

    #[test]
    fn writes_into_guest_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)])
            .expect("anonymous test memory");
        write_mptable(&mem, 2).expect("write");
        let mut sig = [0u8; 4];
        mem.read_slice(&mut sig, GuestAddress(MPTABLE_START))
            .expect("read");
        assert_eq!(&sig, b"_MP_");
    }
}
