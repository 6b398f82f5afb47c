//! Boot page tables: an identity map of the first 4 GiB with 2 MiB pages, so a
//! 64-bit guest can run from its load address and reach RAM below the MMIO gap
//! and the gap's devices before it builds its own tables. RAM above 4 GiB is
//! not mapped here; a kernel maps it itself.

use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::layout::{BOOT_PD_COUNT, PDPT_START, PD_START, PML4_START};

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
/// In a page-directory entry: maps a 2 MiB page instead of pointing to a table.
const PAGE_SIZE_2M: u64 = 1 << 7;
const ENTRIES_PER_TABLE: u64 = 512;
const TABLE_BYTES: u64 = 4096;

/// Writes PML4 -> PDPT -> [`BOOT_PD_COUNT`] page directories. The values are
/// built in one buffer and written at once: the tables are contiguous.
pub fn write_boot_page_tables(mem: &GuestMemoryMmap) -> Result<(), GuestMemoryError> {
    mem.write_obj(PDPT_START | PRESENT | WRITABLE, GuestAddress(PML4_START))?;

    let pdpt: Vec<u8> = (0..BOOT_PD_COUNT)
        .flat_map(|i| ((PD_START + i * TABLE_BYTES) | PRESENT | WRITABLE).to_le_bytes())
        .collect();
    mem.write_slice(&pdpt, GuestAddress(PDPT_START))?;

    let pds: Vec<u8> = (0..BOOT_PD_COUNT * ENTRIES_PER_TABLE)
        .flat_map(|i| ((i << 21) | PRESENT | WRITABLE | PAGE_SIZE_2M).to_le_bytes())
        .collect();
    mem.write_slice(&pds, GuestAddress(PD_START))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_maps_the_first_four_gib() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)])
            .expect("anonymous test memory");
        write_boot_page_tables(&mem).expect("write");
        let pml4e: u64 = mem.read_obj(GuestAddress(PML4_START)).expect("read");
        assert_eq!(pml4e, PDPT_START | 3);
        let pdpte3: u64 = mem.read_obj(GuestAddress(PDPT_START + 24)).expect("read");
        assert_eq!(pdpte3, (PD_START + 3 * 4096) | 3);
        // The last 2 MiB page below 4 GiB maps to itself.
        let last = BOOT_PD_COUNT * ENTRIES_PER_TABLE - 1;
        let pde: u64 = mem
            .read_obj(GuestAddress(PD_START + last * 8))
            .expect("read");
        assert_eq!(pde, (last << 21) | 0x83);
        assert_eq!(
            (last + 1) << 21,
            super::super::layout::IDENTITY_MAPPED_BYTES
        );
    }
}
