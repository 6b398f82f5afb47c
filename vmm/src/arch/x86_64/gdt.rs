//! The boot GDT and the conversion of its descriptors into the `kvm_segment`
//! values KVM loads into the segment registers (KVM takes the hidden
//! descriptor-cache parts directly, so both must agree or the first reload of a
//! segment register changes the CPU's mode under the guest).

use kvm_bindings::kvm_segment;

/// Index of the 64-bit code segment (selector 0x08).
pub const CODE_INDEX: u8 = 1;
/// Index of the data segment (selector 0x10).
pub const DATA_INDEX: u8 = 2;
/// Index of the TSS (selector 0x18); KVM needs a usable TR to enter the guest.
pub const TSS_INDEX: u8 = 3;

/// The boot GDT: null, 64-bit code (L=1), flat data, TSS. Same values as
/// Firecracker's, which Linux's early boot accepts.
pub const BOOT_GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

/// The GDT for the PVH entry (32-bit protected mode, paging off): null, flat
/// 32-bit code (D=1), flat data, and a 32-bit TSS with base 0 and limit 0x67,
/// as the PVH ABI asks for TR. Same selectors as [`BOOT_GDT`].
pub const PVH_GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xc09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x008b, 0, 0x67),
];

/// Encodes a segment descriptor. `flags` holds the access byte in bits 0-7 and
/// the G/DB/L/AVL nibble in bits 12-15, as in the descriptor's upper half.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (flags as u64, base as u64, limit as u64);
    ((base & 0xff00_0000) << (56 - 24))
        | ((flags & 0x0000_f0ff) << 40)
        | ((limit & 0x000f_0000) << (48 - 16))
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

fn base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

fn bit(entry: u64, shift: u32) -> u8 {
    ((entry >> shift) & 1) as u8
}

fn limit(entry: u64) -> u32 {
    let raw = (((entry >> 32) & 0x000f_0000) | (entry & 0x0000_ffff)) as u32;
    // With G set the limit counts 4 KiB pages; KVM wants it in bytes.
    if bit(entry, 55) == 0 {
        raw
    } else {
        (raw << 12) | 0xfff
    }
}

/// The `kvm_segment` for GDT entry `index` holding `entry`.
pub fn kvm_segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let present = bit(entry, 47);
    kvm_segment {
        base: base(entry),
        limit: limit(entry),
        selector: u16::from(index) * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(entry, 54),
        s: bit(entry, 44),
        l: bit(entry, 53),
        g: bit(entry, 55),
        avl: bit(entry, 52),
        padding: 0,
        unusable: u8::from(present == 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_64_bit_ring_0() {
        let cs = kvm_segment_from_gdt(BOOT_GDT[CODE_INDEX as usize], CODE_INDEX);
        assert_eq!(cs.selector, 0x08);
        assert_eq!(cs.l, 1);
        assert_eq!(cs.db, 0);
        assert_eq!(cs.dpl, 0);
        assert_eq!(cs.present, 1);
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.s, 1);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.unusable, 0);
    }

    #[test]
    fn data_and_tss_segments() {
        let ds = kvm_segment_from_gdt(BOOT_GDT[DATA_INDEX as usize], DATA_INDEX);
        assert_eq!((ds.selector, ds.type_, ds.db, ds.l), (0x10, 0x3, 1, 0));
        let tr = kvm_segment_from_gdt(BOOT_GDT[TSS_INDEX as usize], TSS_INDEX);
        assert_eq!((tr.selector, tr.type_, tr.s), (0x18, 0xb, 0));
        let null = kvm_segment_from_gdt(BOOT_GDT[0], 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn pvh_segments_are_32_bit() {
        let cs = kvm_segment_from_gdt(PVH_GDT[CODE_INDEX as usize], CODE_INDEX);
        assert_eq!((cs.selector, cs.l, cs.db, cs.type_), (0x08, 0, 1, 0xb));
        assert_eq!(cs.limit, 0xffff_ffff);
        let tr = kvm_segment_from_gdt(PVH_GDT[TSS_INDEX as usize], TSS_INDEX);
        assert_eq!((tr.base, tr.limit, tr.type_, tr.present), (0, 0x67, 0xb, 1));
    }

    #[test]
    fn base_and_limit_round_trip() {
        let e = gdt_entry(0x0093, 0x1234_5678, 0xabcde);
        assert_eq!(base(e), 0x1234_5678);
        assert_eq!(limit(e), 0xabcde);
    }
}
