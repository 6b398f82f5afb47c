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
/// protocol uses the same page for its start_info.
pub const BOOT_INFO_START: u64 = 0x6000;
/// Reserved for Linux's zero page (boot_params), not written yet.
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
/// Most virtio devices: IOAPIC pins 5..=12, and the boot-info block's list.
pub const MAX_VIRTIO_DEVICES: usize = 8;
/// The TSS area KVM needs on Intel (three pages just below the 4 GiB BIOS
/// area); it must not overlap RAM, so it lives in the MMIO gap.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;

/// Smallest guest RAM accepted: the boot structures take the first MiB and a
/// kernel needs at least some room above it.
pub const MIN_MEM_MIB: u64 = 2;
