//! The boot-info block: the VMM's description of the machine for the
//! freestanding test guest (vmm/guest/boot_info.h is the C half; keep the two
//! in step). Linux gets its boot_params zero page instead, once that path lands.

use vm_memory::ByteValued;

/// "SBXB" read as a little-endian u32.
pub const BOOT_INFO_MAGIC: u32 = 0x4258_4253;
/// Bumped whenever the layout changes.
pub const BOOT_INFO_VERSION: u32 = 1;

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
}

// SAFETY: `BootInfo` is `repr(C)` with only integer fields laid out without
// padding (4 x u32 then 4 x u64), so every byte pattern is a valid value.
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_c_header() {
        // boot_info.h: 4 x unsigned int, then 4 x unsigned long (LP64).
        assert_eq!(std::mem::size_of::<BootInfo>(), 48);
        assert_eq!(std::mem::offset_of!(BootInfo, mem_bytes), 16);
        assert_eq!(std::mem::offset_of!(BootInfo, cmdline_len), 40);
        assert_eq!(&BOOT_INFO_MAGIC.to_le_bytes(), b"SBXB");
    }
}
