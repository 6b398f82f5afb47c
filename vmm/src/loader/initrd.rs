//! The initramfs: opened (and sized) before any KVM work, then copied to the
//! top of low RAM, page-aligned, below the highest address the kernel
//! accepts and above everything the kernel occupies while it starts. Top of
//! RAM is where boot loaders put it: it keeps clear of a kernel that
//! relocates or decompresses itself upwards from its load address.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::setup_header;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::arch::zero_page::InitrdRange;

/// Pages are where Linux expects the initramfs to start.
const PAGE_SIZE: u64 = 4096;
/// The highest initramfs address the boot protocol promises every kernel
/// accepts (`initrd_addr_max`'s value before protocol 2.03); used for a
/// vmlinux and PVH, which state no limit.
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;

/// Why the initramfs could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InitrdError {
    /// The file could not be opened or sized.
    #[error("cannot open initramfs {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// An empty file.
    #[error("initramfs {path} is empty; pass a cpio archive or leave out --initrd")]
    Empty {
        /// The path.
        path: PathBuf,
    },
    /// The kernel does not take one.
    #[error(
        "the kernel image boots with the test guest's boot-info protocol, which takes no \
         initramfs; leave out --initrd"
    )]
    Unsupported,
    /// Not enough RAM between the kernel and the limit.
    #[error(
        "initramfs {path} ({size} bytes) does not fit between the kernel (which needs RAM up \
         to {kernel_end:#x}) and {limit:#x}; raise --mem-mib or use a smaller initramfs"
    )]
    DoesNotFit {
        /// The path.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// End of the kernel's memory.
        kernel_end: u64,
        /// End of the RAM it may use.
        limit: u64,
    },
    /// Reading it into guest memory failed.
    #[error("cannot read initramfs {path} into guest memory: {source}")]
    Load {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}

/// An open initramfs.
#[derive(Debug)]
pub struct Initrd {
    path: PathBuf,
    file: File,
    size: u64,
}

/// Where an initramfs of `size` bytes goes: as high as possible below both
/// `ram_end` and `addr_max + 1`, page-aligned, and not below `kernel_end`.
pub fn placement(size: u64, kernel_end: u64, ram_end: u64, addr_max: u64) -> Option<u64> {
    let limit = ram_end.min(addr_max.saturating_add(1));
    let addr = limit.checked_sub(size)? & !(PAGE_SIZE - 1);
    (addr >= kernel_end).then_some(addr)
}

/// The highest address the kernel accepts an initramfs at, from a bzImage's
/// header when there is one.
pub fn addr_max(header: Option<&setup_header>) -> u64 {
    header
        .map(|h| u64::from(h.initrd_addr_max))
        .filter(|&max| max != 0)
        .unwrap_or(DEFAULT_INITRD_ADDR_MAX)
}

impl Initrd {
    /// Opens the initramfs at `path`.
    pub fn open(path: &Path) -> Result<Self, InitrdError> {
        let open_err = |source| InitrdError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let size = file.metadata().map_err(open_err)?.len();
        if size == 0 {
            return Err(InitrdError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Initrd {
            path: path.to_owned(),
            file,
            size,
        })
    }

    /// Copies the initramfs into `mem` (see [`placement`]).
    pub fn load(
        &mut self,
        mem: &GuestMemoryMmap,
        kernel_end: u64,
        ram_end: u64,
        addr_max: u64,
    ) -> Result<InitrdRange, InitrdError> {
        let addr = placement(self.size, kernel_end, ram_end, addr_max).ok_or_else(|| {
            InitrdError::DoesNotFit {
                path: self.path.clone(),
                size: self.size,
                kernel_end,
                limit: ram_end.min(addr_max.saturating_add(1)),
            }
        })?;
        let len = usize::try_from(self.size).map_err(|_| InitrdError::DoesNotFit {
            path: self.path.clone(),
            size: self.size,
            kernel_end,
            limit: ram_end,
        })?;
        mem.read_exact_volatile_from(GuestAddress(addr), &mut self.file, len)
            .map_err(|source| InitrdError::Load {
                path: self.path.clone(),
                source,
            })?;
        Ok(InitrdRange {
            addr,
            size: self.size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn placed_at_the_top_page_aligned_and_above_the_kernel() {
        let mib = 1u64 << 20;
        assert_eq!(
            placement(0x1800, 16 * mib, 64 * mib, DEFAULT_INITRD_ADDR_MAX),
            Some(64 * mib - 0x2000)
        );
        // The kernel's limit wins over RAM.
        assert_eq!(
            placement(4096, 16 * mib, 2048 * mib, DEFAULT_INITRD_ADDR_MAX),
            Some(0x3800_0000 - 4096)
        );
        // Not above the kernel: refused.
        assert_eq!(placement(60 * mib, 16 * mib, 64 * mib, u64::MAX), None);
        assert_eq!(placement(u64::MAX, 0, 64 * mib, u64::MAX), None);
        let hdr = setup_header {
            initrd_addr_max: 0x7fff_ffff,
            ..Default::default()
        };
        assert_eq!(addr_max(Some(&hdr)), 0x7fff_ffff);
        assert_eq!(addr_max(None), DEFAULT_INITRD_ADDR_MAX);
    }

    #[test]
    fn loads_the_file_and_refuses_missing_empty_or_oversized_ones() {
        let dir = std::env::temp_dir().join(format!("vmm-initrd-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("initrd");
        File::create(&path)
            .and_then(|mut f| f.write_all(b"070701 cpio"))
            .expect("write");
        let mem =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("memory");
        let mut initrd = Initrd::open(&path).expect("open");
        let range = initrd
            .load(&mem, 2 << 20, 4 << 20, DEFAULT_INITRD_ADDR_MAX)
            .expect("load");
        assert_eq!(
            range,
            InitrdRange {
                addr: (4 << 20) - 4096,
                size: 11
            }
        );
        let mut back = [0u8; 11];
        mem.read_slice(&mut back, GuestAddress(range.addr))
            .expect("read");
        assert_eq!(&back, b"070701 cpio");

        let mut again = Initrd::open(&path).expect("open");
        let err = again
            .load(&mem, 4 << 20, 4 << 20, DEFAULT_INITRD_ADDR_MAX)
            .unwrap_err();
        assert!(err.to_string().contains("--mem-mib"), "{err}");

        File::create(&path).expect("truncate");
        assert!(matches!(
            Initrd::open(&path),
            Err(InitrdError::Empty { .. })
        ));
        assert!(matches!(
            Initrd::open(&dir.join("missing")),
            Err(InitrdError::Open { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
