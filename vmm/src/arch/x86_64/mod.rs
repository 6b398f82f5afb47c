//! x86_64 machine setup. The VMM writes the boot structures into low guest
//! memory and loads the boot vCPU's registers to match, for one of three
//! boot protocols ([`BootProtocol`]):
//! - the test guest's: 64-bit long mode on the VMM's GDT and identity page
//!   tables, the boot-info block in `%rdi`;
//! - Linux's 64-bit boot protocol: the same long-mode state, the zero page
//!   in `%rsi`, plus an MP table;
//! - PVH: 32-bit protected mode, `hvm_start_info` in `%ebx`, plus an MP
//!   table.
//!
//! This module owns the memory map and the one-time writes into guest
//! memory; `regs`, `cpuid`, `msr` and `interrupts` configure each vCPU.

pub mod boot_info;
pub mod cpuid;
pub mod e820;
pub mod gdt;
pub mod interrupts;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod pvh;
pub mod regs;
pub mod zero_page;

use linux_loader::loader::bootparam::setup_header;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use self::boot_info::{BootInfo, BootVirtio};
use self::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_INFO_START, CMDLINE_MAX_LEN, CMDLINE_START, MMIO_GAP_END,
    MMIO_GAP_START, ZERO_PAGE_START,
};
use self::regs::BootEntry;
use self::zero_page::{InitrdRange, ZeroPageError};

/// How the kernel wants to be booted (the loader decides, from the image).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BootProtocol {
    /// The test guest's private boot-info block (it carries a `sandboxd`
    /// ELF note).
    BootInfo,
    /// The PVH boot ABI (an ELF kernel with a Xen PHYS32_ENTRY note).
    Pvh,
    /// Linux's 64-bit boot protocol with a zero page; `setup_header` is the
    /// bzImage's, or `None` for an ELF vmlinux.
    Linux64 {
        /// The kernel's setup header, for a bzImage.
        setup_header: Option<setup_header>,
    },
}

impl BootProtocol {
    /// Whether the guest is Linux (and so gets an MP table, e820 and the
    /// Linux command-line additions).
    pub fn is_linux(&self) -> bool {
        !matches!(self, BootProtocol::BootInfo)
    }

    /// The name used in messages.
    pub fn name(&self) -> &'static str {
        match self {
            BootProtocol::BootInfo => "boot-info (test guest)",
            BootProtocol::Pvh => "PVH",
            BootProtocol::Linux64 {
                setup_header: Some(_),
            } => "Linux 64-bit (bzImage)",
            BootProtocol::Linux64 { setup_header: None } => "Linux 64-bit (vmlinux)",
        }
    }

    /// How the boot vCPU enters the kernel at `entry`.
    pub fn boot_entry(&self, entry: u64) -> BootEntry {
        match self {
            BootProtocol::BootInfo => BootEntry::LongMode {
                entry,
                params: BOOT_INFO_START,
            },
            BootProtocol::Pvh => BootEntry::Pvh {
                entry,
                start_info: BOOT_INFO_START,
            },
            BootProtocol::Linux64 { .. } => BootEntry::LongMode {
                entry,
                params: ZERO_PAGE_START,
            },
        }
    }
}

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
    /// The MP table could not be written.
    #[error("cannot write the MP table into guest memory: {0}")]
    MpTable(#[source] GuestMemoryError),
    /// The zero page could not be built.
    #[error(transparent)]
    ZeroPage(#[from] ZeroPageError),
    /// The zero page could not be written.
    #[error("cannot write the zero page into guest memory: {0}")]
    ZeroPageWrite(#[source] GuestMemoryError),
    /// The PVH start info could not be written.
    #[error("cannot write the PVH start info into guest memory: {0}")]
    StartInfo(#[source] GuestMemoryError),
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
    /// Kernel command line, without terminator (for Linux, with the VMM's
    /// additions already made).
    pub cmdline: &'a [u8],
    /// The virtio-mmio devices, for the boot-info block.
    pub virtio: &'a [BootVirtio],
    /// The boot protocol.
    pub protocol: BootProtocol,
    /// Where the initramfs was loaded, if there is one (Linux only).
    pub initrd: Option<InitrdRange>,
}

/// Writes everything the boot vCPU needs into guest memory: descriptor
/// tables, page tables, command line (NUL-terminated), and the protocol's
/// parameters: the boot-info block, or the MP table and the zero page or
/// PVH start info.
pub fn configure_system(
    mem: &GuestMemoryMmap,
    info: &SystemInfo<'_>,
) -> Result<(), ConfigureSystemError> {
    let gdt = match info.protocol {
        BootProtocol::Pvh => gdt::PVH_GDT,
        BootProtocol::BootInfo | BootProtocol::Linux64 { .. } => gdt::BOOT_GDT,
    };
    mem.write_obj(gdt, GuestAddress(BOOT_GDT_START))
        .map_err(ConfigureSystemError::DescriptorTables)?;
    // One zeroed IDT entry: nothing is delivered until the guest loads its own.
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(ConfigureSystemError::DescriptorTables)?;
    // PVH starts with paging off and builds its own; the tables cost nothing.
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

    match info.protocol {
        BootProtocol::BootInfo => {
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
        }
        BootProtocol::Pvh => {
            mptable::write_mptable(mem, info.vcpus).map_err(ConfigureSystemError::MpTable)?;
            let start = pvh::start_info(&e820::memory_map(info.mem_bytes), info.initrd);
            pvh::write_start_info(mem, &start).map_err(ConfigureSystemError::StartInfo)?;
        }
        BootProtocol::Linux64 { setup_header } => {
            mptable::write_mptable(mem, info.vcpus).map_err(ConfigureSystemError::MpTable)?;
            let params = zero_page::boot_params(
                setup_header,
                info.cmdline.len(),
                info.initrd,
                &e820::memory_map(info.mem_bytes),
            )?;
            mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
                .map_err(ConfigureSystemError::ZeroPageWrite)?;
        }
    }
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
            protocol: BootProtocol::BootInfo,
            initrd: None,
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
            protocol: BootProtocol::BootInfo,
            initrd: None,
        };
        assert!(matches!(
            configure_system(&mem, &info),
            Err(ConfigureSystemError::CmdlineTooLong { .. })
        ));
    }
}
