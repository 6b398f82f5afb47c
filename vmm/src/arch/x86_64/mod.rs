//! x86_64 machine setup. The VMM enters the guest directly in 64-bit long mode
//! (the state Linux's 64-bit boot protocol expects): it writes a GDT, an empty
//! IDT and identity-mapping page tables into low guest memory, then loads the
//! vCPU registers to match. This module owns the memory map and the one-time
//! writes into guest memory; `regs`, `cpuid`, `msr` and `interrupts` configure
//! each vCPU.

pub mod boot_info;
pub mod cpuid;
pub mod gdt;
pub mod interrupts;
pub mod layout;
pub mod msr;
pub mod paging;
pub mod regs;

use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use self::boot_info::{BootInfo, BootVirtio};
use self::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_INFO_START, CMDLINE_MAX_LEN, CMDLINE_START, MMIO_GAP_END,
    MMIO_GAP_START,
};

/// Failures writing the boot structures into guest memory. They mean guest RAM
/// is too small for the fixed layout, which config validation should already
/// have refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureSystemError {
    /// The GDT or IDT could not be written.
    #[error("cannot write the boot GDT/IDT into guest memory: {0}")]
    DescriptorTables(#[source] GuestMemoryError),
    /// The page tables could not be written.
    #[error("cannot write the boot page tables into guest memory: {0}")]
    PageTables(#[source] GuestMemoryError),
    /// The boot-info block could not be written.
    #[error("cannot write the boot-info block into guest memory: {0}")]
    BootInfo(#[source] GuestMemoryError),
    /// The command line is longer than the space reserved for it.
    #[error("kernel command line is {len} bytes; the limit is {max}: shorten it")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The command line could not be written.
    #[error("cannot write the kernel command line into guest memory: {0}")]
    Cmdline(#[source] GuestMemoryError),
}

/// The RAM regions for `mem_bytes` of guest memory: one region from 0, split
/// around the 32-bit MMIO gap when it would reach into it.
pub fn arch_memory_regions(mem_bytes: u64) -> Vec<(GuestAddress, u64)> {
    if mem_bytes <= MMIO_GAP_START {
        vec![(GuestAddress(0), mem_bytes)]
    } else {
        vec![
            (GuestAddress(0), MMIO_GAP_START),
            (GuestAddress(MMIO_GAP_END), mem_bytes - MMIO_GAP_START),
        ]
    }
}

/// End (exclusive) of the RAM below the MMIO gap.
pub fn low_ram_end(mem_bytes: u64) -> u64 {
    mem_bytes.min(MMIO_GAP_START)
}

/// What [`configure_system`] describes to the guest.
#[derive(Clone, Copy, Debug)]
pub struct SystemInfo<'a> {
    /// Guest RAM in bytes.
    pub mem_bytes: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// Kernel command line, without terminator.
    pub cmdline: &'a [u8],
    /// The virtio-mmio devices, for the boot-info block.
    pub virtio: &'a [BootVirtio],
}

/// Writes everything the boot vCPU needs into guest memory: descriptor tables,
/// page tables, command line (NUL-terminated) and the boot-info block.
pub fn configure_system(
    mem: &GuestMemoryMmap,
    info: &SystemInfo<'_>,
) -> Result<(), ConfigureSystemError> {
    mem.write_obj(gdt::BOOT_GDT, GuestAddress(BOOT_GDT_START))
        .map_err(ConfigureSystemError::DescriptorTables)?;
    // One zeroed IDT entry: nothing is delivered until the guest loads its own.
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(ConfigureSystemError::DescriptorTables)?;
    paging::write_boot_page_tables(mem).map_err(ConfigureSystemError::PageTables)?;

    if info.cmdline.len() > CMDLINE_MAX_LEN {
        return Err(ConfigureSystemError::CmdlineTooLong {
            len: info.cmdline.len(),
            max: CMDLINE_MAX_LEN,
        });
    }
    let mut cmdline = Vec::with_capacity(info.cmdline.len() + 1);
    cmdline.extend_from_slice(info.cmdline);
    cmdline.push(0);
    mem.write_slice(&cmdline, GuestAddress(CMDLINE_START))
        .map_err(ConfigureSystemError::Cmdline)?;

    let boot_info = BootInfo::new(
        info.vcpus,
        info.mem_bytes,
        low_ram_end(info.mem_bytes),
        CMDLINE_START,
        info.cmdline.len() as u64,
    )
    .with_virtio(info.virtio);
    mem.write_obj(boot_info, GuestAddress(BOOT_INFO_START))
        .map_err(ConfigureSystemError::BootInfo)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_regions_split_around_the_mmio_gap() {
        assert_eq!(
            arch_memory_regions(64 << 20),
            vec![(GuestAddress(0), 64 << 20)]
        );
        assert_eq!(
            arch_memory_regions(MMIO_GAP_START),
            vec![(GuestAddress(0), MMIO_GAP_START)]
        );
        assert_eq!(
            arch_memory_regions(4 << 30),
            vec![
                (GuestAddress(0), MMIO_GAP_START),
                (GuestAddress(MMIO_GAP_END), (4 << 30) - MMIO_GAP_START)
            ]
        );
        assert_eq!(low_ram_end(4 << 30), MMIO_GAP_START);
        assert_eq!(low_ram_end(64 << 20), 64 << 20);
    }

    #[test]
    fn configure_system_writes_boot_info_and_cmdline() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)])
            .expect("anonymous test memory");
        let info = SystemInfo {
            mem_bytes: 2 << 20,
            vcpus: 3,
            cmdline: b"exit=7",
            virtio: &[BootVirtio {
                base: 0xd000_0000,
                gsi: 5,
                device_type: 2,
            }],
        };
        configure_system(&mem, &info).expect("configure");
        let bi: BootInfo = mem.read_obj(GuestAddress(BOOT_INFO_START)).expect("read");
        assert_eq!(bi.vcpus, 3);
        assert_eq!(bi.mem_bytes, 2 << 20);
        assert_eq!(bi.cmdline_len, 6);
        assert_eq!(bi.virtio_count, 1);
        assert_eq!(bi.virtio[0].base, 0xd000_0000);
        assert_eq!(bi.virtio[0].gsi, 5);
        let mut cmdline = [0u8; 7];
        mem.read_slice(&mut cmdline, GuestAddress(CMDLINE_START))
            .expect("read");
        assert_eq!(&cmdline, b"exit=7\0");
    }

    #[test]
    fn configure_system_refuses_overlong_cmdline() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)])
            .expect("anonymous test memory");
        let long = vec![b'x'; CMDLINE_MAX_LEN + 1];
        let info = SystemInfo {
            mem_bytes: 2 << 20,
            vcpus: 1,
            cmdline: &long,
            virtio: &[],
        };
        assert!(matches!(
            configure_system(&mem, &info),
            Err(ConfigureSystemError::CmdlineTooLong { .. })
        ));
    }
}
