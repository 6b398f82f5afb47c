//! Loading the guest kernel. The format is ELF64 for x86_64 (a Linux vmlinux,
//! or the freestanding test guest): each PT_LOAD segment is copied to its
//! physical address (`p_paddr`) and the boot vCPU starts at `e_entry` in
//! 64-bit long mode. Before copying, the program headers are checked against
//! the memory map, so an image that needs more RAM than configured, or that
//! would overwrite the boot structures below 1 MiB, is refused with a reason.
//! bzImage and the PVH 32-bit entry are not supported yet.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use linux_loader::elf::{Elf64_Ehdr, Elf64_Phdr, EI_CLASS, ELFCLASS64, EM_X86_64, PT_LOAD};
use linux_loader::loader::{Elf, KernelLoader};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

use crate::arch::layout::HIMEM_START;

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";

/// Why the kernel could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The file could not be opened.
    #[error("cannot open kernel image {path}: {source}")]
    Open {
        /// The kernel path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The file could not be read.
    #[error("cannot read kernel image {path}: {source}")]
    Read {
        /// The kernel path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Not an ELF file.
    #[error(
        "kernel image {path} is not an ELF file; pass an uncompressed ELF kernel \
         (vmlinux) or the test guest (bzImage is not supported yet)"
    )]
    NotElf {
        /// The kernel path.
        path: PathBuf,
    },
    /// ELF, but not 64-bit little-endian x86_64.
    #[error("kernel image {path} is not a 64-bit x86_64 ELF file ({what})")]
    WrongArch {
        /// The kernel path.
        path: PathBuf,
        /// What is wrong.
        what: &'static str,
    },
    /// No PT_LOAD segment, or a malformed one.
    #[error("kernel image {path} is malformed: {what}")]
    Malformed {
        /// The kernel path.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A segment or the entry point lies below the kernel load floor.
    #[error(
        "kernel image {path} loads at {addr:#x}, below {floor:#x} where the vmm keeps its boot \
         structures; link the kernel at or above {floor:#x}"
    )]
    BelowFloor {
        /// The kernel path.
        path: PathBuf,
        /// The offending address.
        addr: u64,
        /// The lowest allowed address.
        floor: u64,
    },
    /// A segment reaches past the RAM below the MMIO gap.
    #[error(
        "kernel image {path} needs guest RAM up to {end:#x} but the VM has RAM up to \
         {ram_end:#x}; raise --mem-mib"
    )]
    DoesNotFit {
        /// The kernel path.
        path: PathBuf,
        /// End of the highest segment.
        end: u64,
        /// End of usable RAM.
        ram_end: u64,
    },
    /// linux-loader failed to copy the image.
    #[error("cannot load kernel image {path}: {source}")]
    Load {
        /// The kernel path.
        path: PathBuf,
        /// The error.
        #[source]
        source: linux_loader::loader::Error,
    },
}

/// Where a loaded kernel starts and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedKernel {
    /// The 64-bit entry point.
    pub entry: GuestAddress,
    /// End (exclusive) of the highest segment, bss included.
    pub end: u64,
}

/// An open kernel image. Opening is separate from loading so that a missing
/// file is reported before any KVM work starts.
#[derive(Debug)]
pub struct KernelImage {
    path: PathBuf,
    file: File,
}

impl KernelImage {
    /// Reads the image from the inherited descriptor `fd` (duplicated; the
    /// caller's stays open). It must be seekable: a regular file or memfd.
    pub fn from_fd(fd: RawFd) -> Result<Self, LoaderError> {
        let path = PathBuf::from(format!("--kernel-fd {fd}"));
        let file = crate::config::dup_inherited(fd)
            .map_err(|source| LoaderError::Open {
                path: path.clone(),
                source,
            })?
            .into();
        Ok(KernelImage { path, file })
    }

    /// Opens the image at `path`.
    pub fn open(path: &Path) -> Result<Self, LoaderError> {
        let file = File::open(path).map_err(|source| LoaderError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(KernelImage {
            path: path.to_owned(),
            file,
        })
    }

    fn read_err(&self) -> impl Fn(io::Error) -> LoaderError + '_ {
        move |source| LoaderError::Read {
            path: self.path.clone(),
            source,
        }
    }

    fn malformed(&self, what: impl Into<String>) -> LoaderError {
        LoaderError::Malformed {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    /// Reads and checks the ELF header; returns it and the PT_LOAD headers.
    fn headers(&mut self) -> Result<(Elf64_Ehdr, Vec<Elf64_Phdr>), LoaderError> {
        let mut ehdr = Elf64_Ehdr::default();
        self.file.rewind().map_err(self.read_err())?;
        if let Err(e) = self.file.read_exact(ehdr.as_mut_slice()) {
            return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                LoaderError::NotElf {
                    path: self.path.clone(),
                }
            } else {
                self.read_err()(e)
            });
        }
        if ehdr.e_ident[..4] != ELF_MAGIC {
            return Err(LoaderError::NotElf {
                path: self.path.clone(),
            });
        }
        let wrong = |what| LoaderError::WrongArch {
            path: self.path.clone(),
            what,
        };
        if ehdr.e_ident[EI_CLASS] != ELFCLASS64 {
            return Err(wrong("not ELFCLASS64"));
        }
        if ehdr.e_machine != EM_X86_64 {
            return Err(wrong("e_machine is not EM_X86_64"));
        }
        if usize::from(ehdr.e_phentsize) != std::mem::size_of::<Elf64_Phdr>() {
            return Err(self.malformed("program header size is not 56"));
        }
        self.file
            .seek(SeekFrom::Start(ehdr.e_phoff))
            .map_err(self.read_err())?;
        let mut loads = Vec::new();
        for _ in 0..ehdr.e_phnum {
            let mut phdr = Elf64_Phdr::default();
            self.file
                .read_exact(phdr.as_mut_slice())
                .map_err(|_| self.malformed("program headers run past the end of the file"))?;
            if phdr.p_type == PT_LOAD && phdr.p_memsz > 0 {
                loads.push(phdr);
            }
        }
        if loads.is_empty() {
            return Err(self.malformed("no loadable (PT_LOAD) segment"));
        }
        Ok((ehdr, loads))
    }

    /// Checks the image against guest RAM `[HIMEM_START, ram_end)` and copies
    /// it into `mem`.
    pub fn load(
        &mut self,
        mem: &GuestMemoryMmap,
        ram_end: u64,
    ) -> Result<LoadedKernel, LoaderError> {
        let (ehdr, loads) = self.headers()?;
        let mut end = 0u64;
        for phdr in &loads {
            if phdr.p_paddr < HIMEM_START {
                return Err(LoaderError::BelowFloor {
                    path: self.path.clone(),
                    addr: phdr.p_paddr,
                    floor: HIMEM_START,
                });
            }
            if phdr.p_filesz > phdr.p_memsz {
                return Err(self.malformed("a segment's file size exceeds its memory size"));
            }
            let seg_end = phdr
                .p_paddr
                .checked_add(phdr.p_memsz)
                .ok_or_else(|| self.malformed("a segment wraps around the address space"))?;
            end = end.max(seg_end);
        }
        if end > ram_end {
            return Err(LoaderError::DoesNotFit {
                path: self.path.clone(),
                end,
                ram_end,
            });
        }
        if ehdr.e_entry < HIMEM_START {
            return Err(LoaderError::BelowFloor {
                path: self.path.clone(),
                addr: ehdr.e_entry,
                floor: HIMEM_START,
            });
        }
        // Guest memory starts zeroed, so bss needs no clearing.
        let loaded = Elf::load(mem, None, &mut self.file, Some(GuestAddress(HIMEM_START)))
            .map_err(|source| LoaderError::Load {
                path: self.path.clone(),
                source,
            })?;
        Ok(LoadedKernel {
            entry: loaded.kernel_load,
            end: loaded.kernel_end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::Bytes;

    /// A minimal ELF64 x86_64 image: one PT_LOAD segment of `code` at `paddr`.
    fn elf(paddr: u64, code: &[u8], memsz: u64, machine: u16) -> Vec<u8> {
        let ehdr_len = std::mem::size_of::<Elf64_Ehdr>();
        let phdr_len = std::mem::size_of::<Elf64_Phdr>();
        let mut ehdr = Elf64_Ehdr {
            e_type: 2,
            e_machine: machine,
            e_version: 1,
            e_entry: paddr,
            e_phoff: ehdr_len as u64,
            e_ehsize: ehdr_len as u16,
            e_phentsize: phdr_len as u16,
            e_phnum: 1,
            ..Default::default()
        };
        ehdr.e_ident[..4].copy_from_slice(&ELF_MAGIC);
        ehdr.e_ident[EI_CLASS] = ELFCLASS64;
        ehdr.e_ident[5] = 1; // ELFDATA2LSB
        ehdr.e_ident[6] = 1; // EV_CURRENT
        let phdr = Elf64_Phdr {
            p_type: PT_LOAD,
            p_flags: 7,
            p_offset: (ehdr_len + phdr_len) as u64,
            p_vaddr: paddr,
            p_paddr: paddr,
            p_filesz: code.len() as u64,
            p_memsz: memsz,
            p_align: 1,
        };
        let mut image = ehdr.as_slice().to_vec();
        image.extend_from_slice(phdr.as_slice());
        image.extend_from_slice(code);
        image
    }

    fn image_file(bytes: &[u8]) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("kernel");
        File::create(&path)
            .and_then(|mut f| f.write_all(bytes))
            .expect("write test image");
        (dir, path)
    }

    mod tempdir {
        /// A scratch directory removed on drop (no tempfile dependency).
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "vmm-loader-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).expect("create scratch dir");
                Dir(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn mem(bytes: usize) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes)]).expect("test memory")
    }

    #[test]
    fn loads_segment_at_its_physical_address() {
        let (_dir, path) = image_file(&elf(0x10_0000, &[0xf4, 0x90], 0x1000, EM_X86_64));
        let mem = mem(2 << 20);
        let loaded = KernelImage::open(&path)
            .and_then(|mut k| k.load(&mem, 2 << 20))
            .expect("load");
        assert_eq!(loaded.entry, GuestAddress(0x10_0000));
        assert_eq!(loaded.end, 0x10_1000);
        let byte: u8 = mem.read_obj(GuestAddress(0x10_0001)).expect("read");
        assert_eq!(byte, 0x90);
    }

    #[test]
    fn refuses_missing_non_elf_wrong_arch_and_oversized_images() {
        let err = KernelImage::open(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(matches!(err, LoaderError::Open { .. }), "{err}");

        let mem = mem(2 << 20);
        let load = |bytes: &[u8]| {
            let (_dir, path) = image_file(bytes);
            KernelImage::open(&path).and_then(|mut k| k.load(&mem, 2 << 20))
        };
        assert!(matches!(
            load(b"MZ not an elf"),
            Err(LoaderError::NotElf { .. })
        ));
        assert!(matches!(load(b""), Err(LoaderError::NotElf { .. })));
        assert!(matches!(
            load(&elf(0x10_0000, &[0xf4], 1, 3)),
            Err(LoaderError::WrongArch { .. })
        ));
        assert!(matches!(
            load(&elf(0x1000, &[0xf4], 1, EM_X86_64)),
            Err(LoaderError::BelowFloor { .. })
        ));
        let err = load(&elf(0x10_0000, &[0xf4], 4 << 20, EM_X86_64)).unwrap_err();
        assert!(matches!(err, LoaderError::DoesNotFit { .. }), "{err}");
        assert!(err.to_string().contains("--mem-mib"));
    }
}
