//! bzImage kernels: the setup header at offset 0x1f1 (Documentation/arch/
//! x86/boot.rst) is read and checked here, so that garbage and kernels this
//! VMM cannot enter are refused with a reason; linux-loader then copies the
//! protected-mode part to `code32_start`. The VMM does not run the 16-bit
//! setup code: it enters the 64-bit entry point, 0x200 past the load
//! address, in long mode, with the header copied into the zero page.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, KernelLoader};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

use super::{LoadedKernel, LoaderError};
use crate::arch::layout::{CMDLINE_MAX_LEN, HIMEM_START};
use crate::arch::zero_page::HDRS_MAGIC;
use crate::arch::BootProtocol;

/// Offset of the setup header in the image (and in the zero page).
pub const SETUP_HEADER_OFFSET: u64 = 0x1f1;
/// The 64-bit entry point's offset from the load address (boot protocol
/// 2.12+, "64-bit boot protocol").
pub const ENTRY_64_OFFSET: u64 = 0x200;
/// Boot protocol 2.12: the first with `xloadflags`.
pub const MIN_BOOT_PROTOCOL: u16 = 0x020c;
/// Boot protocol 2.10: the first with `pref_address` and `init_size`.
const PROTOCOL_2_10: u16 = 0x020a;
/// Boot protocol 2.06: the first with `cmdline_size`.
const PROTOCOL_2_06: u16 = 0x0206;
/// xloadflags XLF_KERNEL_64: the kernel has the 64-bit entry at 0x200.
pub const XLF_KERNEL_64: u16 = 1 << 0;
/// loadflags LOADED_HIGH: the protected-mode code loads at 1 MiB (a bzImage,
/// not an old zImage).
const LOADED_HIGH: u8 = 1 << 0;

/// Reads the setup header; `None` if the file has none (too short, or no
/// `HdrS` magic), i.e. is not a bzImage.
pub(super) fn read_header(
    file: &mut File,
    path: &Path,
) -> Result<Option<setup_header>, LoaderError> {
    let mut hdr = setup_header::default();
    let read = file
        .seek(SeekFrom::Start(SETUP_HEADER_OFFSET))
        .and_then(|_| file.read_exact(hdr.as_mut_slice()));
    match read {
        Ok(()) => Ok(({ hdr.header } == HDRS_MAGIC).then_some(hdr)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(source) => Err(LoaderError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Refuses headers this VMM cannot boot, saying why.
pub fn check_header(hdr: &setup_header, path: &Path) -> Result<(), LoaderError> {
    let refuse = |what: String| LoaderError::BzImage {
        path: path.to_owned(),
        what,
    };
    let version = hdr.version;
    if version < MIN_BOOT_PROTOCOL {
        return Err(refuse(format!(
            "boot protocol {}.{:02} is older than 2.12 (Linux 3.8), which has the 64-bit \
             entry this vmm uses; use a newer kernel or its vmlinux",
            version >> 8,
            version & 0xff
        )));
    }
    if hdr.loadflags & LOADED_HIGH == 0 {
        return Err(refuse(
            "it is a zImage (not loaded high); build a bzImage".to_owned(),
        ));
    }
    if { hdr.xloadflags } & XLF_KERNEL_64 == 0 {
        return Err(refuse(
            "it has no 64-bit entry point (a 32-bit kernel?); build an x86_64 kernel".to_owned(),
        ));
    }
    if u64::from(hdr.code32_start) < HIMEM_START {
        return Err(refuse(format!("it loads at {:#x}, below 1 MiB", {
            hdr.code32_start
        })));
    }
    Ok(())
}

/// The command-line limit the kernel states, capped at the VMM's.
pub fn cmdline_limit(hdr: &setup_header) -> Option<usize> {
    (hdr.version >= PROTOCOL_2_06)
        .then(|| usize::try_from(hdr.cmdline_size).unwrap_or(usize::MAX))
        .map(|n| n.min(CMDLINE_MAX_LEN))
}

/// End of the memory the kernel needs before it manages memory itself:
/// the decompressor works in `init_size` bytes from the larger of the load
/// address and `pref_address` (where a relocatable kernel moves to).
pub fn footprint_end(hdr: &setup_header, image_end: u64) -> u64 {
    let load = u64::from(hdr.code32_start);
    if hdr.version < PROTOCOL_2_10 {
        return image_end;
    }
    let base = load.max(hdr.pref_address);
    image_end.max(base.saturating_add(u64::from(hdr.init_size)))
}

/// Copies the kernel to `code32_start` after checking it fits below
/// `ram_end`.
pub(super) fn load(
    hdr: &setup_header,
    file: &mut File,
    path: &Path,
    mem: &GuestMemoryMmap,
    ram_end: u64,
) -> Result<LoadedKernel, LoaderError> {
    let file_len = file
        .metadata()
        .map_err(|source| LoaderError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    let load_addr = u64::from(hdr.code32_start);
    // Checked against what linux-loader copies: all but the setup sectors.
    let image_end = load_addr.saturating_add(file_len);
    let end = footprint_end(hdr, image_end);
    if end > ram_end {
        return Err(LoaderError::DoesNotFit {
            path: path.to_owned(),
            end,
            ram_end,
        });
    }
    let loaded =
        BzImage::load(mem, None, file, Some(GuestAddress(HIMEM_START))).map_err(|source| {
            LoaderError::Load {
                path: path.to_owned(),
                source,
            }
        })?;
    let setup_header = loaded.setup_header.unwrap_or(*hdr);
    Ok(LoadedKernel {
        entry: GuestAddress(loaded.kernel_load.0 + ENTRY_64_OFFSET),
        end: end.max(loaded.kernel_end),
        protocol: BootProtocol::Linux64 {
            setup_header: Some(setup_header),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file with `hdr` at 0x1f1 and `payload` after 4 setup sectors.
    fn bzimage_bytes(hdr: &setup_header, payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 5 * 512];
        let at = SETUP_HEADER_OFFSET as usize;
        image[at..at + hdr.as_slice().len()].copy_from_slice(hdr.as_slice());
        image.extend_from_slice(payload);
        image
    }

    fn good_header() -> setup_header {
        setup_header {
            setup_sects: 4,
            boot_flag: 0xaa55,
            header: HDRS_MAGIC,
            version: 0x020f,
            loadflags: LOADED_HIGH,
            code32_start: 0x10_0000,
            xloadflags: XLF_KERNEL_64,
            cmdline_size: 0x7ff,
            pref_address: 0x100_0000,
            init_size: 0x20_0000,
            ..Default::default()
        }
    }

    fn file_with(bytes: &[u8]) -> (File, std::path::PathBuf) {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "vmm-bzimage-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::create(&path).expect("create");
        f.write_all(bytes).expect("write");
        (File::open(&path).expect("open"), path)
    }

    fn header_of(bytes: &[u8]) -> Result<Option<setup_header>, LoaderError> {
        let (mut f, path) = file_with(bytes);
        let r = read_header(&mut f, &path);
        let _ = std::fs::remove_file(&path);
        r
    }

    #[test]
    fn reads_a_good_header() {
        let hdr = header_of(&bzimage_bytes(&good_header(), b"payload"))
            .expect("read")
            .expect("a bzImage");
        assert_eq!({ hdr.version }, 0x020f);
        check_header(&hdr, Path::new("k")).expect("bootable");
        assert_eq!(cmdline_limit(&hdr), Some(0x7ff));
        assert_eq!(footprint_end(&hdr, 0x10_1000), 0x120_0000);
    }

    #[test]
    fn garbage_is_not_a_bzimage() {
        assert!(header_of(b"").expect("read").is_none());
        assert!(
            header_of(&[0xffu8; 300]).expect("read").is_none(),
            "too short"
        );
        assert!(
            header_of(&[0x5au8; 8192]).expect("read").is_none(),
            "no HdrS"
        );
        assert!(header_of(&vec![0u8; 4096]).expect("read").is_none());
    }

    #[test]
    fn refuses_kernels_it_cannot_enter() {
        let check = |hdr: setup_header| check_header(&hdr, Path::new("k")).unwrap_err().to_string();
        let old = check(setup_header {
            version: 0x0204,
            ..good_header()
        });
        assert!(old.contains("2.04") && old.contains("vmlinux"), "{old}");
        let zimage = check(setup_header {
            loadflags: 0,
            ..good_header()
        });
        assert!(zimage.contains("zImage"), "{zimage}");
        let i386 = check(setup_header {
            xloadflags: 0,
            ..good_header()
        });
        assert!(i386.contains("64-bit entry"), "{i386}");
        let low = check(setup_header {
            code32_start: 0x1_0000,
            ..good_header()
        });
        assert!(low.contains("below 1 MiB"), "{low}");
    }

    #[test]
    fn loads_at_code32_start_and_enters_at_0x200() {
        let bytes = bzimage_bytes(&good_header(), &[0x90; 0x400]);
        let (mut f, path) = file_with(&bytes);
        let mem =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 32 << 20)]).expect("memory");
        let loaded = load(&good_header(), &mut f, &path, &mem, 32 << 20).expect("load");
        assert_eq!(loaded.entry, GuestAddress(0x10_0200));
        // pref_address + init_size.
        assert_eq!(loaded.end, 0x120_0000);
        let err = load(&good_header(), &mut f, &path, &mem, 16 << 20).unwrap_err();
        assert!(err.to_string().contains("--mem-mib"), "{err}");
        let _ = std::fs::remove_file(&path);
    }

    /// Debian's packaged kernel, when this host has one: its header must
    /// parse and be bootable.
    #[test]
    fn parses_an_installed_distribution_kernel() {
        // The host's own kernel where it has one; else the guest kernel
        // scripts/build-guest-kernel.sh builds from Debian's source (test.sh
        // runs it first), so a host that boots without /boot still checks a
        // real bzImage. Nothing installs a kernel on the host for this.
        let installed = std::fs::read_dir("/boot").ok().and_then(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().contains("vmlinuz"))
        });
        let built = std::path::Path::new("/var/cache/sandboxd-build/kernel/current/bzImage");
        let Some(path) = installed.or_else(|| built.is_file().then(|| built.to_path_buf())) else {
            sandboxd_test_support::skip!(
                sandboxd_test_support::Reason::MissingTool,
                "no /boot/vmlinuz* and no guest kernel at /var/cache/sandboxd-build/kernel/current/bzImage (run scripts/build-guest-kernel.sh)"
            );
        };
        let mut f = File::open(&path).expect("open");
        let hdr = read_header(&mut f, &path)
            .expect("read")
            .expect("a bzImage");
        check_header(&hdr, &path).expect("bootable");
    }
}
