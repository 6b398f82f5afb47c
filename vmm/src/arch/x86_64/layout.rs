//! The guest-physical memory map: where the VMM puts the boot structures, where
//! RAM lives and where it stops for the MMIO gap. Addresses below 1 MiB follow
//! Firecracker's (and so what Linux's 64-bit boot protocol expects), so the
//! Linux boot path can reuse them.

/// Start of the boot GDT (4 entries: null, code, data, TSS).
pub const BOOT_GDT_START: u64 = 0x500;
/// Start of the boot IDT: one empty entry. The guest installs its own before
/// it enables interrupts; until then any exception triple-faults, which the
/// VMM reports.
pub const BOOT_IDT_START: u64 = 0x520;
/// The test guest's boot-info block (see [`super::boot_info`]). The PVH boot
/// protocol uses the same page for its `hvm_start_info` (only one of the two
/// is ever written).
pub const BOOT_INFO_START: u64 = 0x6000;
/// PVH: the module list (one entry, the initramfs), after `hvm_start_info`.
pub const PVH_MODLIST_START: u64 = 0x6040;
/// PVH: the memory map, after the module list; room for 160 entries.
pub const PVH_MEMMAP_START: u64 = 0x6080;
/// Linux's zero page (`boot_params`) for the 64-bit boot protocol.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer of the boot vCPU (grows down, below the page tables).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Boot page tables: PML4, one PDPT, then [`BOOT_PD_COUNT`] page directories.
pub const PML4_START: u64 = 0x9000;
/// The boot PDPT.
pub const PDPT_START: u64 = 0xa000;
/// The first boot page directory.
pub const PD_START: u64 = 0xb000;
/// Page directories in the boot tables; each maps 1 GiB with 2 MiB pages.
pub const BOOT_PD_COUNT: u64 = 4;
/// Bytes identity-mapped by the boot page tables: the whole 32-bit space, so
/// RAM below the MMIO gap and the gap itself (LAPIC, IOAPIC, virtio-mmio) are
/// reachable before the guest builds its own tables.
pub const IDENTITY_MAPPED_BYTES: u64 = BOOT_PD_COUNT << 30;
/// Start of the extended BIOS data area on a PC: RAM ends here for the guest
/// (e820) and the MP table lives here, in the last KiB below 640 KiB, where
/// Linux looks for the MP floating pointer when the BIOS data area names no
/// EBDA. The area up to 1 MiB is reserved.
pub const EBDA_START: u64 = 0x9_fc00;
/// The MP table: floating pointer, then the configuration table.
pub const MPTABLE_START: u64 = EBDA_START;
/// The IOAPIC's MMIO base (KVM's in-kernel IOAPIC sits at the PC default).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// The local APICs' MMIO base.
pub const APIC_START: u64 = 0xfee0_0000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Longest command line accepted, terminator excluded (Linux's x86
/// COMMAND_LINE_SIZE is 2048 with the terminator).
pub const CMDLINE_MAX_LEN: usize = 2047;
/// Lowest address a kernel may be loaded at: everything below holds the boot
/// structures above (or the legacy BIOS hole).
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO gap: RAM stops here and resumes at 4 GiB, so that
/// devices (LAPIC, IOAPIC, and later virtio-mmio) have 32-bit addresses.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End (exclusive) of the 32-bit MMIO gap.
pub const MMIO_GAP_END: u64 = 1 << 32;
/// First virtio-mmio device window; device `i` is at
/// `VIRTIO_MMIO_START + i * VIRTIO_MMIO_SIZE`. Inside the MMIO gap, clear of
/// the IOAPIC (0xfec0_0000), the LAPIC (0xfee0_0000) and the TSS area.
pub const VIRTIO_MMIO_START: u64 = 0xd000_0000;
/// Size of one virtio-mmio window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Interrupt line of the first virtio device; device `i` gets GSI
/// `VIRTIO_GSI_START + i`. GSI 4 is COM1; 5 and up are free ISA/IOAPIC pins
/// (Firecracker numbers its devices' lines the same way).
pub const VIRTIO_GSI_START: u32 = 5;
/// Most virtio devices: IOAPIC pins 5..=23, every pin of KVM's in-kernel
/// IOAPIC from the first free one on, each wired by the MP table (as
/// Firecracker's are). A CRI pod's microVM spends most of them on its
/// containers' root slots.
pub const MAX_VIRTIO_DEVICES: usize =
    super::mptable::IOAPIC_PINS as usize - VIRTIO_GSI_START as usize;

/// Where virtio device number `index` (below [`MAX_VIRTIO_DEVICES`]) sits:
/// its MMIO base and its GSI.
pub const fn virtio_slot(index: usize) -> (u64, u32) {
    (
        VIRTIO_MMIO_START + index as u64 * VIRTIO_MMIO_SIZE,
        VIRTIO_GSI_START + index as u32,
    )
}
/// The TSS area KVM needs on Intel (three pages just below the 4 GiB BIOS
/// area); it must not overlap RAM, so it lives in the MMIO gap.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;

/// Smallest guest RAM accepted: the boot structures take the first MiB and a
/// kernel needs at least some room above it.
pub const MIN_MEM_MIB: u64 = 2;
