//! ELF64 x86_64 images (a Linux vmlinux, the test guest): header checks, the
//! PT_NOTE scan that picks the boot protocol, and loading each PT_LOAD
//! segment at its physical address (`p_paddr`) through linux-loader once the
//! segments are known to lie in RAM above the boot structures.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::elf::{Elf64_Ehdr, Elf64_Phdr, EI_CLASS, ELFCLASS64, EM_X86_64, PT_LOAD};
use linux_loader::loader::{Elf, KernelLoader};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

use super::notes::{self, BootNotes, MAX_NOTE_SEGMENT};
use super::{LoadedKernel, LoaderError};
use crate::arch::boot_info::BOOT_INFO_VERSION;
use crate::arch::layout::HIMEM_START;
use crate::arch::BootProtocol;

pub(super) const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const PT_NOTE: u32 = 4;

/// The headers of an ELF kernel, read and checked.
#[derive(Debug)]
pub(super) struct ElfImage {
    ehdr: Elf64_Ehdr,
    loads: Vec<Elf64_Phdr>,
    notes: BootNotes,
}

fn read_err(path: &Path) -> impl Fn(io::Error) -> LoaderError + '_ {
    move |source| LoaderError::Read {
        path: path.to_owned(),
        source,
    }
}

fn malformed(path: &Path, what: impl Into<String>) -> LoaderError {
    LoaderError::Malformed {
        path: path.to_owned(),
        what: what.into(),
    }
}

impl ElfImage {
    /// Reads and checks the ELF header, the program headers and the notes.
    pub(super) fn read(file: &mut File, path: &Path) -> Result<Self, LoaderError> {
        let mut ehdr = Elf64_Ehdr::default();
        file.rewind().map_err(read_err(path))?;
        file.read_exact(ehdr.as_mut_slice()).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                malformed(path, "the ELF header is truncated")
            } else {
                read_err(path)(e)
            }
        })?;
        let wrong = |what| LoaderError::WrongArch {
            path: path.to_owned(),
            what,
        };
        if ehdr.e_ident[EI_CLASS] != ELFCLASS64 {
            return Err(wrong("not ELFCLASS64"));
        }
        if ehdr.e_machine != EM_X86_64 {
            return Err(wrong("e_machine is not EM_X86_64"));
        }
        if usize::from(ehdr.e_phentsize) != std::mem::size_of::<Elf64_Phdr>() {
            return Err(malformed(path, "program header size is not 56"));
        }
        file.seek(SeekFrom::Start(ehdr.e_phoff))
            .map_err(read_err(path))?;
        let mut loads = Vec::new();
        let mut note_segments = Vec::new();
        for _ in 0..ehdr.e_phnum {
            let mut phdr = Elf64_Phdr::default();
            file.read_exact(phdr.as_mut_slice())
                .map_err(|_| malformed(path, "program headers run past the end of the file"))?;
            if phdr.p_type == PT_LOAD && phdr.p_memsz > 0 {
                loads.push(phdr);
            } else if phdr.p_type == PT_NOTE {
                note_segments.push(phdr);
            }
        }
        if loads.is_empty() {
            return Err(malformed(path, "no loadable (PT_LOAD) segment"));
        }
        let mut found = BootNotes::default();
        for phdr in note_segments {
            let mut segment = Vec::new();
            file.seek(SeekFrom::Start(phdr.p_offset))
                .map_err(read_err(path))?;
            // A note segment past the end of the file reads short; the scan
            // then sees a truncated note and stops.
            file.by_ref()
                .take(phdr.p_filesz.min(MAX_NOTE_SEGMENT))
                .read_to_end(&mut segment)
                .map_err(read_err(path))?;
            notes::scan(&segment, &mut found);
        }
        let image = ElfImage {
            ehdr,
            loads,
            notes: found,
        };
        image.check_notes(path)?;
        Ok(image)
    }

    fn check_notes(&self, path: &Path) -> Result<(), LoaderError> {
        if let Some(found) = self.notes.sandboxd_boot_info {
            if found != BOOT_INFO_VERSION {
                return Err(LoaderError::BootInfoVersion {
                    path: path.to_owned(),
                    found,
                    expected: BOOT_INFO_VERSION,
                });
            }
        } else if let Some(entry) = self.notes.pvh_entry {
            let entry = u64::from(entry);
            let inside = self.loads.iter().any(|p| {
                entry >= p.p_paddr && entry - p.p_paddr < p.p_filesz && entry >= HIMEM_START
            });
            if !inside {
                return Err(LoaderError::PvhEntry {
                    path: path.to_owned(),
                    entry,
                });
            }
        }
        Ok(())
    }

    /// The protocol the notes ask for: the test guest's note wins over a
    /// PVH note (a test guest may carry both, for QEMU's sake).
    pub(super) fn protocol(&self) -> BootProtocol {
        if self.notes.sandboxd_boot_info.is_some() {
            BootProtocol::BootInfo
        } else if self.notes.pvh_entry.is_some() {
            BootProtocol::Pvh
        } else {
            BootProtocol::Linux64 { setup_header: None }
        }
    }

    /// Checks the segments against guest RAM `[HIMEM_START, ram_end)` and
    /// copies them into `mem`.
    pub(super) fn load(
        &self,
        file: &mut File,
        path: &Path,
        mem: &GuestMemoryMmap,
        ram_end: u64,
    ) -> Result<LoadedKernel, LoaderError> {
        let mut end = 0u64;
        for phdr in &self.loads {
            if phdr.p_paddr < HIMEM_START {
                return Err(LoaderError::BelowFloor {
                    path: path.to_owned(),
                    addr: phdr.p_paddr,
                    floor: HIMEM_START,
                });
            }
            if phdr.p_filesz > phdr.p_memsz {
                return Err(malformed(
                    path,
                    "a segment's file size exceeds its memory size",
                ));
            }
            let seg_end = phdr
                .p_paddr
                .checked_add(phdr.p_memsz)
                .ok_or_else(|| malformed(path, "a segment wraps around the address space"))?;
            end = end.max(seg_end);
        }
        if end > ram_end {
            return Err(LoaderError::DoesNotFit {
                path: path.to_owned(),
                end,
                ram_end,
            });
        }
        let protocol = self.protocol();
        let entry = match (protocol, self.notes.pvh_entry) {
            (BootProtocol::Pvh, Some(pvh)) => u64::from(pvh),
            _ => self.ehdr.e_entry,
        };
        if entry < HIMEM_START {
            return Err(LoaderError::BelowFloor {
                path: path.to_owned(),
                addr: entry,
                floor: HIMEM_START,
            });
        }
        // Guest memory starts zeroed, so bss needs no clearing. The ELF
        // entry (not the PVH one) must also be above the floor for
        // linux-loader, which checks it.
        Elf::load(mem, None, file, Some(GuestAddress(HIMEM_START))).map_err(|source| {
            LoaderError::Load {
                path: path.to_owned(),
                source,
            }
        })?;
        Ok(LoadedKernel {
            entry: GuestAddress(entry),
            end,
            protocol,
        })
    }
}
