//! Loading the guest kernel and choosing its boot protocol from the image
//! alone, so the daemon sets no flag:
//! - an ELF image with a `sandboxd` note (the test guest) gets the private
//!   boot-info block;
//! - else an ELF image with a Xen PHYS32_ENTRY note (a vmlinux built with
//!   CONFIG_PVH) is booted through the PVH ABI;
//! - else an ELF image (a vmlinux) gets Linux's 64-bit boot protocol;
//! - a file that is not ELF but carries a setup header (`HdrS`) is a bzImage:
//!   linux-loader copies its protected-mode part to `code32_start` and the
//!   vCPU enters its 64-bit entry with the header copied into the zero page.
//!
//! Headers are read and checked when the image is opened (before any KVM
//! work), and checked against the memory map before anything is copied, so
//! an image that needs more RAM than configured, or that would overwrite the
//! boot structures below 1 MiB, is refused with a reason. `elf`, `bzimage`,
//! `notes` and `initrd` hold the format-specific parts.

pub mod bzimage;
mod elf;
pub mod initrd;
pub mod notes;

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::setup_header;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::arch::BootProtocol;

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
    /// Neither ELF nor bzImage.
    #[error(
        "kernel image {path} is not an ELF file or a bzImage; pass an uncompressed ELF \
         kernel (vmlinux), a bzImage, or the test guest"
    )]
    NotKernel {
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
    /// The test guest's note asks for a boot-info block this VMM does not write.
    #[error(
        "kernel image {path} asks for boot-info version {found}, this vmm writes version \
         {expected}; rebuild the test guest from this tree (vmm/guest)"
    )]
    BootInfoVersion {
        /// The kernel path.
        path: PathBuf,
        /// Version in the note.
        found: u32,
        /// Version this VMM writes.
        expected: u32,
    },
    /// The PVH entry point lies outside the image.
    #[error(
        "kernel image {path} names PVH entry point {entry:#x}, which is outside its loaded \
         segments; the image is corrupt"
    )]
    PvhEntry {
        /// The kernel path.
        path: PathBuf,
        /// The entry point.
        entry: u64,
    },
    /// A bzImage this VMM cannot boot.
    #[error("kernel image {path} is a bzImage this vmm cannot boot: {what}")]
    BzImage {
        /// The kernel path.
        path: PathBuf,
        /// What is wrong, and what to use instead.
        what: String,
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

/// Where a loaded kernel starts and how far it reaches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadedKernel {
    /// The entry point for [`LoadedKernel::protocol`]: 64-bit for the boot
    /// info and Linux 64-bit protocols, the 32-bit PHYS32_ENTRY for PVH.
    pub entry: GuestAddress,
    /// End (exclusive) of the memory the kernel occupies before it manages
    /// memory itself (bss included; for a bzImage, what the decompressor
    /// needs). An initramfs goes above it.
    pub end: u64,
    /// How the boot vCPU enters the kernel.
    pub protocol: BootProtocol,
}

#[derive(Debug)]
enum Format {
    Elf(elf::ElfImage),
    BzImage(setup_header),
}

/// An open kernel image with its headers read and checked. Opening is
/// separate from loading so that a missing or unusable file is reported
/// before any KVM work starts.
#[derive(Debug)]
pub struct KernelImage {
    path: PathBuf,
    file: File,
    format: Format,
}

impl KernelImage {
    /// Reads the image from the inherited descriptor `fd` (duplicated; the
    /// caller's stays open). It must be seekable: a regular file or memfd.
    pub fn from_fd(fd: std::os::fd::RawFd) -> Result<Self, LoaderError> {
        let path = PathBuf::from(format!("--kernel-fd {fd}"));
        let file: File = crate::config::dup_inherited(fd)
            .map_err(|source| LoaderError::Open {
                path: path.clone(),
                source,
            })?
            .into();
        Self::from_file(file, &path)
    }

    /// Opens the image at `path` and reads its headers.
    pub fn open(path: &Path) -> Result<Self, LoaderError> {
        let file = File::open(path).map_err(|source| LoaderError::Open {
            path: path.to_owned(),
            source,
        })?;
        Self::from_file(file, path)
    }

    /// Reads the headers of the image open as `file` (named `path` in errors).
    fn from_file(mut file: File, path: &Path) -> Result<Self, LoaderError> {
        let mut magic = [0u8; 4];
        let is_elf = match file.read_exact(&mut magic) {
            Ok(()) => magic == elf::ELF_MAGIC,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
            Err(source) => {
                return Err(LoaderError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let format = if is_elf {
            Format::Elf(elf::ElfImage::read(&mut file, path)?)
        } else {
            match bzimage::read_header(&mut file, path)? {
                Some(hdr) => {
                    bzimage::check_header(&hdr, path)?;
                    Format::BzImage(hdr)
                }
                None => {
                    return Err(LoaderError::NotKernel {
                        path: path.to_owned(),
                    })
                }
            }
        };
        file.rewind().map_err(|source| LoaderError::Read {
            path: path.to_owned(),
            source,
        })?;
        Ok(KernelImage {
            path: path.to_owned(),
            file,
            format,
        })
    }

    /// The boot protocol the image asks for.
    pub fn protocol(&self) -> BootProtocol {
        match &self.format {
            Format::Elf(image) => image.protocol(),
            Format::BzImage(hdr) => BootProtocol::Linux64 {
                setup_header: Some(*hdr),
            },
        }
    }

    /// The longest command line the kernel accepts, terminator excluded,
    /// when the image says (a bzImage's `cmdline_size`).
    pub fn cmdline_limit(&self) -> Option<usize> {
        match &self.format {
            Format::Elf(_) => None,
            Format::BzImage(hdr) => bzimage::cmdline_limit(hdr),
        }
    }

    /// Checks the image against guest RAM `[HIMEM_START, ram_end)` and copies
    /// it into `mem`.
    pub fn load(
        &mut self,
        mem: &GuestMemoryMmap,
        ram_end: u64,
    ) -> Result<LoadedKernel, LoaderError> {
        match &self.format {
            Format::Elf(image) => image.load(&mut self.file, &self.path, mem, ram_end),
            Format::BzImage(hdr) => bzimage::load(hdr, &mut self.file, &self.path, mem, ram_end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::notes::{note, SANDBOXD_NOTE_BOOT_INFO, XEN_ELFNOTE_PHYS32_ENTRY};
    use super::*;
    use crate::arch::boot_info::BOOT_INFO_VERSION;
    use linux_loader::elf::{Elf64_Ehdr, Elf64_Phdr, EI_CLASS, ELFCLASS64, EM_X86_64, PT_LOAD};
    use std::io::Write;
    use vm_memory::{ByteValued, Bytes};

    const PT_NOTE: u32 = 4;

    /// A minimal ELF64 image: one PT_LOAD segment of `code` at `paddr`, and
    /// a PT_NOTE segment holding `notes` when there are any.
    fn elf_with_notes(paddr: u64, code: &[u8], memsz: u64, machine: u16, notes: &[u8]) -> Vec<u8> {
        let ehdr_len = std::mem::size_of::<Elf64_Ehdr>();
        let phdr_len = std::mem::size_of::<Elf64_Phdr>();
        let phnum = if notes.is_empty() { 1 } else { 2 };
        let data_at = (ehdr_len + phnum * phdr_len) as u64;
        let mut ehdr = Elf64_Ehdr {
            e_type: 2,
            e_machine: machine,
            e_version: 1,
            e_entry: paddr,
            e_phoff: ehdr_len as u64,
            e_ehsize: ehdr_len as u16,
            e_phentsize: phdr_len as u16,
            e_phnum: phnum as u16,
            ..Default::default()
        };
        ehdr.e_ident[..4].copy_from_slice(&elf::ELF_MAGIC);
        ehdr.e_ident[EI_CLASS] = ELFCLASS64;
        ehdr.e_ident[5] = 1; // ELFDATA2LSB
        ehdr.e_ident[6] = 1; // EV_CURRENT
        let load = Elf64_Phdr {
            p_type: PT_LOAD,
            p_flags: 7,
            p_offset: data_at,
            p_vaddr: paddr,
            p_paddr: paddr,
            p_filesz: code.len() as u64,
            p_memsz: memsz,
            p_align: 1,
        };
        let note_phdr = Elf64_Phdr {
            p_type: PT_NOTE,
            p_flags: 4,
            p_offset: data_at + code.len() as u64,
            p_filesz: notes.len() as u64,
            p_memsz: notes.len() as u64,
            p_align: 4,
            ..Default::default()
        };
        let mut image = ehdr.as_slice().to_vec();
        image.extend_from_slice(load.as_slice());
        if !notes.is_empty() {
            image.extend_from_slice(note_phdr.as_slice());
        }
        image.extend_from_slice(code);
        image.extend_from_slice(notes);
        image
    }

    fn elf(paddr: u64, code: &[u8], memsz: u64, machine: u16) -> Vec<u8> {
        elf_with_notes(paddr, code, memsz, machine, &[])
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

    fn open(bytes: &[u8]) -> Result<KernelImage, LoaderError> {
        let (_dir, path) = image_file(bytes);
        // The file stays open after its directory is removed.
        KernelImage::open(&path)
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
    fn refuses_missing_non_kernel_wrong_arch_and_oversized_images() {
        let err = KernelImage::open(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(matches!(err, LoaderError::Open { .. }), "{err}");

        let mem = mem(2 << 20);
        let load = |bytes: &[u8]| open(bytes).and_then(|mut k| k.load(&mem, 2 << 20));
        let err = load(b"MZ not an elf").unwrap_err();
        assert!(matches!(err, LoaderError::NotKernel { .. }), "{err}");
        assert!(err.to_string().contains("not an ELF file or a bzImage"));
        assert!(matches!(load(b""), Err(LoaderError::NotKernel { .. })));
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

    #[test]
    fn the_image_chooses_the_protocol() {
        let code = [0x90u8; 64];
        let plain = open(&elf(0x10_0000, &code, 64, EM_X86_64)).expect("open");
        assert_eq!(
            plain.protocol(),
            BootProtocol::Linux64 { setup_header: None }
        );

        let sandboxd = note(
            b"sandboxd",
            SANDBOXD_NOTE_BOOT_INFO,
            &BOOT_INFO_VERSION.to_le_bytes(),
        );
        let guest =
            open(&elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &sandboxd)).expect("open");
        assert_eq!(guest.protocol(), BootProtocol::BootInfo);

        let pvh = note(
            b"Xen",
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x10_0010u32.to_le_bytes(),
        );
        let mut other = note(b"GNU", 3, &[0; 20]);
        other.extend_from_slice(&pvh);
        let mut kernel =
            open(&elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &other)).expect("open");
        assert_eq!(kernel.protocol(), BootProtocol::Pvh);
        let loaded = kernel.load(&mem(2 << 20), 2 << 20).expect("load");
        assert_eq!(
            loaded.entry,
            GuestAddress(0x10_0010),
            "the PVH entry, not e_entry"
        );
        assert_eq!(loaded.protocol, BootProtocol::Pvh);

        // Both notes: the test guest's wins (it may carry a PVH note for QEMU).
        let mut both = pvh.clone();
        both.extend_from_slice(&sandboxd);
        let guest = open(&elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &both)).expect("open");
        assert_eq!(guest.protocol(), BootProtocol::BootInfo);
    }

    #[test]
    fn refuses_a_stale_test_guest_and_a_pvh_entry_outside_the_image() {
        let code = [0x90u8; 64];
        let old = note(b"sandboxd", SANDBOXD_NOTE_BOOT_INFO, &1u32.to_le_bytes());
        let err = open(&elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &old)).unwrap_err();
        assert!(
            matches!(err, LoaderError::BootInfoVersion { found: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("rebuild the test guest"));

        let outside = note(
            b"Xen",
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x20_0000u32.to_le_bytes(),
        );
        let err = open(&elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &outside)).unwrap_err();
        assert!(
            matches!(
                err,
                LoaderError::PvhEntry {
                    entry: 0x20_0000,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_note_segment_past_the_end_of_the_file_is_harmless() {
        let code = [0x90u8; 64];
        let pvh = note(
            b"Xen",
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x10_0010u32.to_le_bytes(),
        );
        let mut bytes = elf_with_notes(0x10_0000, &code, 64, EM_X86_64, &pvh);
        bytes.truncate(bytes.len() - 6);
        let kernel = open(&bytes).expect("open");
        assert_eq!(
            kernel.protocol(),
            BootProtocol::Linux64 { setup_header: None }
        );
    }
}
