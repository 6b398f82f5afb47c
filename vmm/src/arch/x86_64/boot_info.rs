//! The boot-info block: the VMM's description of the machine for the
//! freestanding test guest (vmm/guest/boot_info.h is the C half; keep the two
//! in step). The guest asks for it with a `sandboxd` ELF note (guest/note.S);
//! Linux gets a zero page or PVH start info instead.

use vm_memory::ByteValued;

/// "SBXB" read as a little-endian u32.
pub const BOOT_INFO_MAGIC: u32 = 0x4258_4253;
/// Bumped whenever the layout changes (2: virtio-mmio device list).
pub const BOOT_INFO_VERSION: u32 = 2;
/// Most virtio-mmio devices the block lists: the test guest drives no
/// more (a Linux guest, which may have up to `MAX_VIRTIO_DEVICES`, reads
/// the command line instead).
pub const BOOT_INFO_MAX_VIRTIO: usize = 8;

/// One virtio-mmio device: where its registers are and which interrupt line
/// it raises. The guest learns its devices here; there is no ACPI or device
/// tree (a Linux guest gets `virtio_mmio.device=` command-line words).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootVirtio {
    /// Guest-physical base of the 4 KiB register window.
    pub base: u64,
    /// The GSI (IOAPIC pin) of its interrupt.
    pub gsi: u32,
    /// The virtio device ID (2 block, 19 vsock).
    pub device_type: u32,
}

/// Written at [`super::layout::BOOT_INFO_START`]; the boot vCPU gets its
/// address in `%rdi` (and `%rsi`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u32,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// vCPUs created for the VM.
    pub vcpus: u32,
    /// Zero.
    pub reserved: u32,
    /// Guest RAM in total, in bytes.
    pub mem_bytes: u64,
    /// End (exclusive) of RAM below the MMIO gap.
    pub low_ram_end: u64,
    /// Guest-physical address of the command line.
    pub cmdline_addr: u64,
    /// Its length in bytes, without the terminator.
    pub cmdline_len: u64,
    /// Entries used in `virtio`.
    pub virtio_count: u32,
    /// Zero.
    pub reserved2: u32,
    /// The virtio-mmio devices, in the order the VMM placed them.
    pub virtio: [BootVirtio; BOOT_INFO_MAX_VIRTIO],
}

// SAFETY: `BootVirtio` is `repr(C)`: a u64 then two u32, 16 bytes with no
// padding; every byte pattern is a valid value.
unsafe impl ByteValued for BootVirtio {}

// SAFETY: `BootInfo` is `repr(C)` with only integer fields and arrays of the
// padding-free `BootVirtio`, laid out without padding (4 x u32, 4 x u64,
// 2 x u32, 8 x 16 bytes), so every byte pattern is a valid value.
unsafe impl ByteValued for BootInfo {}

impl BootInfo {
    /// A block with the magic and version filled in.
    pub fn new(
        vcpus: u8,
        mem_bytes: u64,
        low_ram_end: u64,
        cmdline_addr: u64,
        cmdline_len: u64,
    ) -> Self {
        BootInfo {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_INFO_VERSION,
            vcpus: u32::from(vcpus),
            reserved: 0,
            mem_bytes,
            low_ram_end,
            cmdline_addr,
            cmdline_len,
            virtio_count: 0,
            reserved2: 0,
            virtio: [BootVirtio::default(); BOOT_INFO_MAX_VIRTIO],
        }
    }

    /// Lists the first [`BOOT_INFO_MAX_VIRTIO`] of `devices`.
    pub fn with_virtio(mut self, devices: &[BootVirtio]) -> Self {
        let n = devices.len().min(BOOT_INFO_MAX_VIRTIO);
        self.virtio[..n].copy_from_slice(&devices[..n]);
        self.virtio_count = n as u32;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_c_header() {
        // boot_info.h: 4 x unsigned int, 4 x unsigned long (LP64), 2 x
        // unsigned int, then 8 x struct boot_virtio (16 bytes each).
        assert_eq!(std::mem::size_of::<BootVirtio>(), 16);
        assert_eq!(std::mem::size_of::<BootInfo>(), 48 + 8 + 8 * 16);
        assert_eq!(std::mem::offset_of!(BootInfo, mem_bytes), 16);
        assert_eq!(std::mem::offset_of!(BootInfo, cmdline_len), 40);
        assert_eq!(std::mem::offset_of!(BootInfo, virtio_count), 48);
        assert_eq!(std::mem::offset_of!(BootInfo, virtio), 56);
        assert_eq!(std::mem::offset_of!(BootVirtio, gsi), 8);
        assert_eq!(&BOOT_INFO_MAGIC.to_le_bytes(), b"SBXB");
    }
}
