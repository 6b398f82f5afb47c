//! The guest's physical memory map as a Linux kernel is told it (the zero
//! page's e820 table, PVH's memmap): the same RAM the VMM registers with KVM
//! (`arch_memory_regions`), minus the legacy area below 1 MiB that holds the
//! EBDA/MP table and the PC's ROM/VGA hole. The 32-bit MMIO gap is simply not
//! RAM (not listed), as on QEMU's microvm and Firecracker, so the kernel
//! never allocates from it and the virtio-mmio windows inside it are free.

use super::layout::{EBDA_START, HIMEM_START, MMIO_GAP_END, MMIO_GAP_START};
use super::low_ram_end;

/// e820 / PVH memmap type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 / PVH memmap type: reserved.
pub const E820_RESERVED: u32 = 2;

/// One entry of the memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRange {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// [`E820_RAM`] or [`E820_RESERVED`] (the e820 and PVH values agree).
    pub kind: u32,
}

impl MemoryRange {
    /// End (exclusive).
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}

/// The memory map for `mem_bytes` of guest RAM, in address order. RAM
/// below the EBDA, the EBDA to 1 MiB reserved, RAM from 1 MiB to the end of
/// low RAM (at most the MMIO gap), and the rest of RAM from 4 GiB.
pub fn memory_map(mem_bytes: u64) -> Vec<MemoryRange> {
    let mut map = vec![
        MemoryRange {
            addr: 0,
            size: EBDA_START.min(mem_bytes),
            kind: E820_RAM,
        },
        MemoryRange {
            addr: EBDA_START,
            size: HIMEM_START - EBDA_START,
            kind: E820_RESERVED,
        },
    ];
    let low_end = low_ram_end(mem_bytes);
    if low_end > HIMEM_START {
        map.push(MemoryRange {
            addr: HIMEM_START,
            size: low_end - HIMEM_START,
            kind: E820_RAM,
        });
    }
    if mem_bytes > MMIO_GAP_START {
        map.push(MemoryRange {
            addr: MMIO_GAP_END,
            size: mem_bytes - MMIO_GAP_START,
            kind: E820_RAM,
        });
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram(map: &[MemoryRange]) -> u64 {
        map.iter()
            .filter(|r| r.kind == E820_RAM)
            .map(|r| r.size)
            .sum()
    }

    #[test]
    fn small_guest_has_low_ram_only() {
        let map = memory_map(64 << 20);
        assert_eq!(
            map,
            vec![
                MemoryRange {
                    addr: 0,
                    size: 0x9_fc00,
                    kind: E820_RAM
                },
                MemoryRange {
                    addr: 0x9_fc00,
                    size: 0x10_0000 - 0x9_fc00,
                    kind: E820_RESERVED
                },
                MemoryRange {
                    addr: 0x10_0000,
                    size: (64 << 20) - 0x10_0000,
                    kind: E820_RAM
                },
            ]
        );
        // Everything but the legacy area is RAM.
        assert_eq!(ram(&map), (64 << 20) - (0x10_0000 - 0x9_fc00));
    }

    #[test]
    fn large_guest_continues_above_4_gib_and_the_gap_is_not_ram() {
        let mem = 6u64 << 30;
        let map = memory_map(mem);
        assert_eq!(map.len(), 4);
        assert_eq!(map[2].end(), MMIO_GAP_START);
        assert_eq!(
            map[3],
            MemoryRange {
                addr: 4 << 30,
                size: mem - MMIO_GAP_START,
                kind: E820_RAM
            }
        );
        for r in &map {
            let overlaps_gap = r.addr < MMIO_GAP_END && r.end() > MMIO_GAP_START;
            assert!(!overlaps_gap, "{r:?} overlaps the MMIO gap");
        }
        assert_eq!(ram(&map), mem - (0x10_0000 - 0x9_fc00));
        // Sorted and not overlapping.
        for pair in map.windows(2) {
            assert!(pair[0].end() <= pair[1].addr, "{pair:?}");
        }
    }

    #[test]
    fn guest_ending_exactly_at_the_gap_has_nothing_above_it() {
        let map = memory_map(MMIO_GAP_START);
        assert_eq!(map.len(), 3);
        assert_eq!(map[2].end(), MMIO_GAP_START);
    }
}
