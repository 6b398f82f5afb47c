//! The PVH boot ABI's start-of-day data (xen/include/public/arch-x86/
//! hvm/start_info.h; Linux's arch/x86/platform/pvh): `hvm_start_info`
//! version 1 at [`BOOT_INFO_START`] with the command line, the memory map
//! and, when there is an initramfs, a one-entry module list (Linux takes the
//! first module as its initramfs). The boot vCPU enters at the kernel's
//! PHYS32_ENTRY with `%ebx` pointing here (see `regs`). There is no ACPI,
//! so `rsdp_paddr` is 0 and Linux finds the CPUs in the MP table.

use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::e820::MemoryRange;
use super::layout::{
    BOOT_INFO_START, CMDLINE_START, PVH_MEMMAP_START, PVH_MODLIST_START, ZERO_PAGE_START,
};
use super::zero_page::InitrdRange;

// The three parts overlap neither each other nor the zero page (a memory
// map has at most four entries).
const _: () = assert!(BOOT_INFO_START + 56 <= PVH_MODLIST_START);
const _: () = assert!(PVH_MODLIST_START + 32 <= PVH_MEMMAP_START);
const _: () = assert!(PVH_MEMMAP_START + 4 * 24 <= ZERO_PAGE_START);

/// Version 1: the memory map fields are present.
const START_INFO_VERSION: u32 = 1;

/// What [`write_start_info`] writes, built apart from guest memory so
/// tests can look at it.
#[derive(Clone, Debug, PartialEq)]
pub struct StartInfo {
    /// The structure the kernel gets in `%ebx`.
    pub info: hvm_start_info,
    /// The module list (empty without an initramfs).
    pub modules: Vec<hvm_modlist_entry>,
    /// The memory map.
    pub memmap: Vec<hvm_memmap_table_entry>,
}

/// The start info for `memory_map` and the initramfs, if any. The command
/// line is at [`CMDLINE_START`], already written.
pub fn start_info(memory_map: &[MemoryRange], initrd: Option<InitrdRange>) -> StartInfo {
    let modules: Vec<hvm_modlist_entry> = initrd
        .map(|r| hvm_modlist_entry {
            paddr: r.addr,
            size: r.size,
            cmdline_paddr: 0,
            reserved: 0,
        })
        .into_iter()
        .collect();
    let memmap: Vec<hvm_memmap_table_entry> = memory_map
        .iter()
        .map(|r| hvm_memmap_table_entry {
            addr: r.addr,
            size: r.size,
            // The e820 and PVH type numbers agree (1 RAM, 2 reserved).
            type_: r.kind,
            reserved: 0,
        })
        .collect();
    let info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: START_INFO_VERSION,
        flags: 0,
        nr_modules: modules.len() as u32,
        modlist_paddr: if modules.is_empty() {
            0
        } else {
            PVH_MODLIST_START
        },
        cmdline_paddr: CMDLINE_START,
        rsdp_paddr: 0,
        memmap_paddr: PVH_MEMMAP_START,
        // The map has at most four entries.
        memmap_entries: memmap.len() as u32,
        reserved: 0,
    };
    StartInfo {
        info,
        modules,
        memmap,
    }
}

/// Writes `start` at [`BOOT_INFO_START`], [`PVH_MODLIST_START`] and
/// [`PVH_MEMMAP_START`].
pub fn write_start_info(mem: &GuestMemoryMmap, start: &StartInfo) -> Result<(), GuestMemoryError> {
    mem.write_obj(start.info, GuestAddress(BOOT_INFO_START))?;
    for (i, module) in start.modules.iter().enumerate() {
        let at = PVH_MODLIST_START + (i * std::mem::size_of::<hvm_modlist_entry>()) as u64;
        mem.write_obj(*module, GuestAddress(at))?;
    }
    for (i, entry) in start.memmap.iter().enumerate() {
        let at = PVH_MEMMAP_START + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64;
        mem.write_obj(*entry, GuestAddress(at))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::e820::{memory_map, E820_RAM};
    use super::*;

    #[test]
    fn start_info_layout_and_contents() {
        // The ABI's sizes (start_info.h): 56, 32 and 24 bytes.
        assert_eq!(std::mem::size_of::<hvm_start_info>(), 56);
        assert_eq!(std::mem::offset_of!(hvm_start_info, cmdline_paddr), 24);
        assert_eq!(std::mem::offset_of!(hvm_start_info, memmap_paddr), 40);
        assert_eq!(std::mem::offset_of!(hvm_start_info, memmap_entries), 48);

        let initrd = InitrdRange {
            addr: 0x7f0_0000,
            size: 0x8000,
        };
        let s = start_info(&memory_map(128 << 20), Some(initrd));
        assert_eq!(s.info.magic, 0x336e_c578);
        assert_eq!(s.info.version, 1);
        assert_eq!(s.info.cmdline_paddr, CMDLINE_START);
        assert_eq!(s.info.rsdp_paddr, 0);
        assert_eq!(
            (s.info.nr_modules, s.info.modlist_paddr),
            (1, PVH_MODLIST_START)
        );
        assert_eq!(
            (s.modules[0].paddr, s.modules[0].size),
            (0x7f0_0000, 0x8000)
        );
        assert_eq!(s.info.memmap_entries, 3);
        assert_eq!(s.memmap[2].addr, 0x10_0000);
        assert_eq!(s.memmap[2].type_, E820_RAM);

        let none = start_info(&memory_map(128 << 20), None);
        assert_eq!((none.info.nr_modules, none.info.modlist_paddr), (0, 0));
    }

    #[test]
    fn writes_into_guest_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)])
            .expect("anonymous test memory");
        let s = start_info(&memory_map(2 << 20), None);
        write_start_info(&mem, &s).expect("write");
        let info: hvm_start_info = mem.read_obj(GuestAddress(BOOT_INFO_START)).expect("read");
        assert_eq!(info, s.info);
        let last: hvm_memmap_table_entry = mem
            .read_obj(GuestAddress(PVH_MEMMAP_START + 2 * 24))
            .expect("read");
        assert_eq!(last, s.memmap[2]);
    }
}
