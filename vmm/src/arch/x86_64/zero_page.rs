//! Linux's zero page (`struct boot_params`, Documentation/arch/x86/boot.rst)
//! for the 64-bit boot protocol: the kernel's own setup header when it came
//! from a bzImage (the protocol says to copy it into the zero page), a
//! synthesised one for an ELF vmlinux, and the loader's fields on top: loader
//! type, command line, initramfs and the e820 memory map.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::e820::MemoryRange;
use super::layout::CMDLINE_START;

/// "HdrS": a setup header of boot protocol 2.00 or later.
pub const HDRS_MAGIC: u32 = 0x5372_6448;
/// The boot sector signature the header carries.
pub const BOOT_FLAG: u16 = 0xaa55;
/// type_of_loader 0xff: "undefined", the value for a loader with no
/// assigned ID (the ext_loader fields stay 0).
pub const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// loadflags LOADED_HIGH: the protected-mode kernel is loaded at 1 MiB+.
pub const LOADED_HIGH: u8 = 0x01;
/// The alignment an ELF vmlinux is linked for (CONFIG_PHYSICAL_ALIGN's
/// default); a bzImage's header carries its own.
const VMLINUX_KERNEL_ALIGNMENT: u32 = 0x0100_0000;

/// Where the initramfs was put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdRange {
    /// Guest-physical start (page-aligned).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Why a zero page could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ZeroPageError {
    /// More memory map entries than the zero page holds (a vmm bug: the
    /// map has at most four).
    #[error("the memory map has {0} entries, the zero page holds 128")]
    TooManyE820Entries(usize),
    /// The initramfs does not lie below 4 GiB.
    #[error("the initramfs at {0:#x} is above 4 GiB; this vmm places it below the MMIO gap")]
    InitrdAbove4G(u64),
}

/// The zero page for a kernel whose setup header is `header` (a bzImage's)
/// or none (an ELF vmlinux), with a command line of `cmdline_len` bytes at
/// [`CMDLINE_START`], the initramfs if any, and `memory_map`.
pub fn boot_params(
    header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<InitrdRange>,
    memory_map: &[MemoryRange],
) -> Result<boot_params, ZeroPageError> {
    let mut params = boot_params::default();
    match header {
        Some(hdr) => params.hdr = hdr,
        None => {
            // What a bzImage's header would say about a vmlinux; the fields
            // a 64-bit kernel reads are set below.
            params.hdr.boot_flag = BOOT_FLAG;
            params.hdr.header = HDRS_MAGIC;
            params.hdr.kernel_alignment = VMLINUX_KERNEL_ALIGNMENT;
            // A bzImage states its own limit; for a vmlinux it is the size.
            params.hdr.cmdline_size = cmdline_len as u32 + 1;
        }
    }
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.loadflags |= LOADED_HIGH;
    // CMDLINE_START is below 1 MiB, so the high half (ext_cmd_line_ptr) is 0.
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    if let Some(initrd) = initrd {
        let addr =
            u32::try_from(initrd.addr).map_err(|_| ZeroPageError::InitrdAbove4G(initrd.addr))?;
        let size =
            u32::try_from(initrd.size).map_err(|_| ZeroPageError::InitrdAbove4G(initrd.addr))?;
        params.hdr.ramdisk_image = addr;
        params.hdr.ramdisk_size = size;
    }
    if memory_map.len() > params.e820_table.len() {
        return Err(ZeroPageError::TooManyE820Entries(memory_map.len()));
    }
    for (slot, range) in params.e820_table.iter_mut().zip(memory_map) {
        *slot = boot_e820_entry {
            addr: range.addr,
            size: range.size,
            r#type: range.kind,
        };
    }
    // Checked above: at most 128.
    params.e820_entries = memory_map.len() as u8;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::super::e820::{memory_map, E820_RAM, E820_RESERVED};
    use super::*;

    #[test]
    fn vmlinux_zero_page_fields() {
        let map = memory_map(6 << 30);
        let initrd = InitrdRange {
            addr: 0xbf00_0000,
            size: 0x12_3456,
        };
        let p = boot_params(None, 42, Some(initrd), &map).expect("zero page");
        let hdr = p.hdr;
        assert_eq!({ hdr.header }, HDRS_MAGIC);
        assert_eq!({ hdr.boot_flag }, BOOT_FLAG);
        assert_eq!(hdr.type_of_loader, 0xff);
        assert_eq!(hdr.loadflags & LOADED_HIGH, LOADED_HIGH);
        assert_eq!({ hdr.cmd_line_ptr }, 0x2_0000);
        assert_eq!({ hdr.cmdline_size }, 43);
        assert_eq!({ hdr.ramdisk_image }, 0xbf00_0000);
        assert_eq!({ hdr.ramdisk_size }, 0x12_3456);
        assert_eq!({ hdr.kernel_alignment }, 0x0100_0000);
        assert_eq!(p.e820_entries, 4);
        let table = p.e820_table;
        let e = |i: usize| ({ table[i].addr }, { table[i].size }, { table[i].r#type });
        assert_eq!(e(0), (0, 0x9_fc00, E820_RAM));
        assert_eq!(e(1), (0x9_fc00, 0x6_0400, E820_RESERVED));
        assert_eq!(e(2), (0x10_0000, 0xc000_0000 - 0x10_0000, E820_RAM));
        assert_eq!(e(3), (1 << 32, (6 << 30) - 0xc000_0000, E820_RAM));
        assert_eq!(e(4), (0, 0, 0), "unused entries stay zero");
    }

    #[test]
    fn bzimage_header_is_kept_and_loader_fields_set() {
        let hdr = setup_header {
            header: HDRS_MAGIC,
            version: 0x020f,
            cmdline_size: 2047,
            loadflags: 0x81,
            code32_start: 0x10_0000,
            kernel_alignment: 0x20_0000,
            ..Default::default()
        };
        let p = boot_params(Some(hdr), 10, None, &memory_map(64 << 20)).expect("zero page");
        let got = p.hdr;
        assert_eq!({ got.version }, 0x020f);
        assert_eq!({ got.cmdline_size }, 2047, "the kernel's limit is kept");
        assert_eq!(got.loadflags, 0x81);
        assert_eq!({ got.kernel_alignment }, 0x20_0000);
        assert_eq!(got.type_of_loader, 0xff);
        assert_eq!({ got.ramdisk_image }, 0);
        assert_eq!(p.e820_entries, 3);
    }

    #[test]
    fn initrd_above_4_gib_is_refused() {
        let initrd = InitrdRange {
            addr: 1 << 32,
            size: 4096,
        };
        assert!(matches!(
            boot_params(None, 0, Some(initrd), &memory_map(64 << 20)),
            Err(ZeroPageError::InitrdAbove4G(_))
        ));
    }
}
