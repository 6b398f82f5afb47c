//! The snapshot's `memory` file: guest RAM regions back to back, as a sparse
//! file holding only the pages the guest ever touched (holes elsewhere), and
//! how a restored VM maps it: read-only file, `MAP_PRIVATE` (copy-on-write),
//! so every fork of one snapshot shares its page cache.
//!
//! Touched pages come from `/proc/self/pagemap` (present or swapped), not
//! `mincore(2)`: mincore misses anonymous pages that are swapped out, which
//! would silently drop guest data on a host with swap, while pagemap's
//! "swapped" bit covers them; both cost one pass over 8 (pagemap) or 1
//! (mincore) bytes per page. A VM that is itself a fork maps a file: its
//! pages with data in that file count as touched too (SEEK_DATA), since a
//! page it never faulted in still holds the snapshot's data.
//!
//! The digest is SHA-256 over (offset, length, bytes) of each written run,
//! so it covers the data and where it lies; a restore also checks that the
//! holes are still holes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    Address, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap,
};

/// Page size the snapshot works in.
pub const PAGE: u64 = 4096;
/// Hashing and writing go in chunks of this size (cache friendly).
const CHUNK: u64 = 1 << 20;
/// pagemap: page present in RAM.
const PM_PRESENT: u64 = 1 << 63;
/// pagemap: page swapped out.
const PM_SWAPPED: u64 = 1 << 62;

/// Why guest memory could not be saved, checked or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MemoryFileError {
    /// Reading /proc/self/pagemap failed.
    #[error("cannot read /proc/self/pagemap to find the guest's touched pages: {0}")]
    Pagemap(#[source] io::Error),
    /// The memory file could not be written.
    #[error("cannot write the snapshot memory file {path}: {source}; check space and permissions")]
    Write {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The memory file could not be opened or read.
    #[error("cannot read the snapshot memory file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The file has the wrong size.
    #[error(
        "the snapshot memory file {path} is {found} bytes, the snapshot says {expected}: \
         it was truncated or replaced; take a new snapshot"
    )]
    Size {
        /// The file.
        path: String,
        /// Its size.
        found: u64,
        /// The recorded size.
        expected: u64,
    },
    /// The contents do not match the digest.
    #[error(
        "the snapshot memory file {path} does not match its checksum ({what}): it is corrupt; \
         take a new snapshot"
    )]
    Checksum {
        /// The file.
        path: String,
        /// What differs.
        what: String,
    },
    /// Mapping the file failed.
    #[error("cannot map the snapshot memory file: {0}")]
    Map(String),
}

/// One guest RAM region and where it lies in the memory file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedRegion {
    /// Guest-physical start.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset in the memory file.
    pub file_offset: u64,
}

/// A run of written (touched) pages in the memory file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// Offset in the memory file.
    pub offset: u64,
    /// Length in bytes (whole pages).
    pub len: u64,
}

/// What the state records about the memory file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLayout {
    /// The regions, in guest address order, back to back in the file.
    pub regions: Vec<SavedRegion>,
    /// The file's length (the sum of the regions).
    pub file_len: u64,
    /// The runs of pages written, sorted, not overlapping or touching.
    pub runs: Vec<Run>,
    /// SHA-256 over each run's offset, length and bytes, hex.
    pub sha256: String,
}

impl MemoryLayout {
    /// Bytes of data the file holds (the rest are holes).
    pub fn data_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Checks what a corrupt state could get wrong before anything is
    /// mapped: regions back to back, page aligned; runs sorted, in the file.
    pub fn validate(&self) -> Result<(), String> {
        let mut at = 0u64;
        for r in &self.regions {
            if r.file_offset != at || r.len == 0 || r.len % PAGE != 0 || r.guest_addr % PAGE != 0 {
                return Err(format!(
                    "memory region {r:?} is not where the file layout puts it"
                ));
            }
            at = at.checked_add(r.len).ok_or("memory regions overflow")?;
        }
        if at != self.file_len {
            return Err(format!(
                "memory regions add up to {at} bytes, the file is recorded as {}",
                self.file_len
            ));
        }
        let mut end = 0u64;
        for r in &self.runs {
            let run_end = r.offset.checked_add(r.len).ok_or("memory run overflows")?;
            if r.offset < end || r.len == 0 || r.offset % PAGE != 0 || r.len % PAGE != 0 {
                return Err(format!("memory run {r:?} is out of order or unaligned"));
            }
            if run_end > self.file_len {
                return Err(format!("memory run {r:?} lies past the end of the file"));
            }
            end = run_end;
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("the memory checksum is not a SHA-256 hex digest".into());
        }
        Ok(())
    }
}

/// Adds `[offset, offset+len)` to sorted `runs`, merging with the last run.
fn push_run(runs: &mut Vec<Run>, offset: u64, len: u64) {
    if let Some(last) = runs.last_mut() {
        if last.offset + last.len >= offset {
            let end = (offset + len).max(last.offset + last.len);
            last.len = end - last.offset;
            return;
        }
    }
    runs.push(Run { offset, len });
}

/// Merges two sorted run lists.
fn union(a: Vec<Run>, b: Vec<Run>) -> Vec<Run> {
    let mut all: Vec<Run> = a.into_iter().chain(b).collect();
    all.sort_by_key(|r| r.offset);
    let mut out = Vec::with_capacity(all.len());
    for r in all {
        push_run(&mut out, r.offset, r.len);
    }
    out
}

/// Pages of the host range `[addr, addr+len)` present or swapped, as runs
/// relative to `addr`.
fn pagemap_runs(pagemap: &File, addr: u64, len: u64) -> io::Result<Vec<Run>> {
    const ENTRIES: u64 = 64 * 1024;
    let mut runs = Vec::new();
    let mut buf = vec![0u8; (ENTRIES * 8) as usize];
    let pages = len / PAGE;
    let first = addr / PAGE;
    let mut done = 0u64;
    while done < pages {
        let n = (pages - done).min(ENTRIES);
        let bytes = &mut buf[..(n * 8) as usize];
        pagemap.read_exact_at(bytes, (first + done) * 8)?;
        for (i, entry) in bytes.chunks_exact(8).enumerate() {
            let mut e = [0u8; 8];
            e.copy_from_slice(entry);
            if u64::from_le_bytes(e) & (PM_PRESENT | PM_SWAPPED) != 0 {
                push_run(&mut runs, (done + i as u64) * PAGE, PAGE);
            }
        }
        done += n;
    }
    Ok(runs)
}

/// Data ranges of `file` within `[start, start+len)`, relative to `start`,
/// widened to pages.
fn file_data_runs(file: &File, start: u64, len: u64) -> io::Result<Vec<Run>> {
    let mut runs = Vec::new();
    let end = start + len;
    let mut at = start;
    while at < end {
        let Some(data) = seek(file, at, libc::SEEK_DATA)? else {
            break;
        };
        if data >= end {
            break;
        }
        let hole = seek(file, data, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
        let from = (data - start) / PAGE * PAGE;
        let to = (hole - start).div_ceil(PAGE) * PAGE;
        push_run(&mut runs, from, to.min(len) - from);
        at = hole.max(data + 1);
    }
    Ok(runs)
}

/// lseek(2) with SEEK_DATA/SEEK_HOLE; `None` for ENXIO (nothing after).
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a descriptor `file` owns; it touches no memory.
    let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(r as u64))
}

/// The bytes of guest memory region `region` at `[offset, offset+len)`.
///
/// # Safety
/// Nothing may write the range while the slice lives: the caller holds the
/// VM paused (vCPUs parked, device workers stopped).
unsafe fn region_bytes(region: &GuestRegionMmap, offset: u64, len: u64) -> &[u8] {
    debug_assert!(offset + len <= region.len());
    // SAFETY: the range lies inside the region's live mapping (callers
    // derive it from the region's length), and the caller guarantees no
    // concurrent writer.
    unsafe { std::slice::from_raw_parts(region.as_ptr().add(offset as usize), len as usize) }
}

fn hash_run_header(h: &mut Sha256, run: &Run) {
    h.update(run.offset.to_le_bytes());
    h.update(run.len.to_le_bytes());
}

/// Writes the touched pages of the paused VM's `mem` to a new file at
/// `path`; returns the layout (with the digest) for the state file.
pub fn write_memory(mem: &GuestMemoryMmap, path: &Path) -> Result<MemoryLayout, MemoryFileError> {
    let werr = |source| MemoryFileError::Write {
        path: path.display().to_string(),
        source,
    };
    let pagemap = crate::jail::pagemap().map_err(MemoryFileError::Pagemap)?;
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(werr)?;
    let mut regions = Vec::new();
    let mut runs = Vec::new();
    let mut hasher = Sha256::new();
    let mut file_offset = 0u64;
    for region in mem.iter() {
        let len = region.len();
        let mut touched = pagemap_runs(&pagemap, region.as_ptr() as u64, len)
            .map_err(MemoryFileError::Pagemap)?;
        if let Some(source) = region.file_offset() {
            let data = file_data_runs(source.file(), source.start(), len).map_err(|source| {
                MemoryFileError::Read {
                    path: "(the memory file this VM was restored from)".into(),
                    source,
                }
            })?;
            touched = union(touched, data);
        }
        for run in &touched {
            let out = Run {
                offset: file_offset + run.offset,
                len: run.len,
            };
            hash_run_header(&mut hasher, &out);
            let mut at = 0;
            while at < run.len {
                let n = (run.len - at).min(CHUNK);
                // SAFETY: the VM is paused by the caller (see
                // `MachineHandle::snapshot`); the range is inside the region.
                let bytes = unsafe { region_bytes(region, run.offset + at, n) };
                file.write_all_at(bytes, out.offset + at).map_err(werr)?;
                hasher.update(bytes);
                at += n;
            }
            runs.push(out);
        }
        regions.push(SavedRegion {
            guest_addr: region.start_addr().raw_value(),
            len,
            file_offset,
        });
        file_offset += len;
    }
    // The untouched tail becomes a hole.
    file.set_len(file_offset).map_err(werr)?;
    Ok(MemoryLayout {
        regions,
        file_len: file_offset,
        runs,
        sha256: hex(&hasher.finalize()),
    })
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Opens the memory file read-only and checks its size against `layout`.
pub fn open_memory(path: &Path, layout: &MemoryLayout) -> Result<File, MemoryFileError> {
    let display = || path.display().to_string();
    let file = File::open(path).map_err(|source| MemoryFileError::Read {
        path: display(),
        source,
    })?;
    let found = file
        .metadata()
        .map_err(|source| MemoryFileError::Read {
            path: display(),
            source,
        })?
        .len();
    if found != layout.file_len {
        return Err(MemoryFileError::Size {
            path: display(),
            found,
            expected: layout.file_len,
        });
    }
    Ok(file)
}

/// Maps the memory file as guest RAM: private (copy-on-write), so guest
/// writes never reach the file and forks share its page cache.
pub fn map_memory(file: File, layout: &MemoryLayout) -> Result<GuestMemoryMmap, MemoryFileError> {
    let file = Arc::new(file);
    let regions = layout
        .regions
        .iter()
        .map(|r| {
            let len = usize::try_from(r.len)
                .map_err(|_| MemoryFileError::Map("region too large".into()))?;
            let mapping = MmapRegionBuilder::<()>::new(len)
                .with_file_offset(FileOffset::from_arc(file.clone(), r.file_offset))
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                .build()
                .map_err(|e| MemoryFileError::Map(e.to_string()))?;
            GuestRegionMmap::new(mapping, GuestAddress(r.guest_addr))
                .ok_or_else(|| MemoryFileError::Map(format!("region {r:?} overflows")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryFileError::Map(e.to_string()))
}

/// Checks the mapped memory against `layout`'s digest, and that the file
/// has no data outside the recorded runs. Reads every written byte (the
/// pages land in the page cache, where forks find them).
pub fn verify_memory(
    mem: &GuestMemoryMmap,
    file: &File,
    layout: &MemoryLayout,
    path: &Path,
) -> Result<(), MemoryFileError> {
    let bad = |what: String| MemoryFileError::Checksum {
        path: path.display().to_string(),
        what,
    };
    let mut hasher = Sha256::new();
    let mut runs = layout.runs.iter().peekable();
    for (region, saved) in mem.iter().zip(&layout.regions) {
        let end = saved.file_offset + saved.len;
        while let Some(run) = runs.next_if(|r| r.offset < end) {
            if run.offset + run.len > end {
                return Err(bad(format!("run {run:?} crosses a region boundary")));
            }
            hash_run_header(&mut hasher, run);
            let mut at = 0;
            while at < run.len {
                let n = (run.len - at).min(CHUNK);
                // SAFETY: no vCPU or device runs yet (restore verifies before
                // building the VM), and the range is inside the region.
                let bytes = unsafe { region_bytes(region, run.offset - saved.file_offset + at, n) };
                hasher.update(bytes);
                at += n;
            }
        }
    }
    if hex(&hasher.finalize()) != layout.sha256 {
        return Err(bad("the written pages differ".into()));
    }
    // Holes: data between runs (a byte written into a hole) is corruption
    // the digest does not see.
    let mut at = 0u64;
    for run in layout.runs.iter().chain(std::iter::once(&Run {
        offset: layout.file_len,
        len: 0,
    })) {
        if at < run.offset {
            let data = seek(file, at, libc::SEEK_DATA).map_err(|source| MemoryFileError::Read {
                path: path.display().to_string(),
                source,
            })?;
            if let Some(d) = data.filter(|&d| d < run.offset) {
                return Err(bad(format!(
                    "data at offset {d:#x}, which should be a hole"
                )));
            }
        }
        at = run.offset + run.len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_union() {
        let mut r = Vec::new();
        push_run(&mut r, 0, PAGE);
        push_run(&mut r, PAGE, PAGE);
        push_run(&mut r, 4 * PAGE, PAGE);
        assert_eq!(
            r,
            vec![
                Run {
                    offset: 0,
                    len: 2 * PAGE
                },
                Run {
                    offset: 4 * PAGE,
                    len: PAGE
                }
            ]
        );
        let u = union(
            r,
            vec![Run {
                offset: 2 * PAGE,
                len: PAGE,
            }],
        );
        assert_eq!(
            u,
            vec![
                Run {
                    offset: 0,
                    len: 3 * PAGE
                },
                Run {
                    offset: 4 * PAGE,
                    len: PAGE
                }
            ]
        );
    }

    fn layout() -> MemoryLayout {
        MemoryLayout {
            regions: vec![SavedRegion {
                guest_addr: 0,
                len: 16 * PAGE,
                file_offset: 0,
            }],
            file_len: 16 * PAGE,
            runs: vec![
                Run {
                    offset: 0,
                    len: PAGE,
                },
                Run {
                    offset: 4 * PAGE,
                    len: 2 * PAGE,
                },
            ],
            sha256: "0".repeat(64),
        }
    }

    #[test]
    fn layout_validation_refuses_what_a_corrupt_state_could_say() {
        assert_eq!(layout().validate(), Ok(()));
        let mut l = layout();
        l.runs.swap(0, 1);
        assert!(l.validate().is_err(), "unsorted runs");
        let mut l = layout();
        l.runs[1].len = 100 * PAGE;
        assert!(l.validate().is_err(), "run past the end");
        let mut l = layout();
        l.runs[1].offset = u64::MAX - 1;
        assert!(l.validate().is_err(), "overflowing run");
        let mut l = layout();
        l.file_len += PAGE;
        assert!(l.validate().is_err(), "regions do not add up");
        let mut l = layout();
        l.sha256 = "xyz".into();
        assert!(l.validate().is_err(), "bad digest");
    }

    #[test]
    fn touched_pages_are_written_sparse_and_verify() {
        let mem = crate::vstate::memory::create_guest_memory(4).expect("memory");
        use vm_memory::Bytes;
        mem.write_obj(0x11u8, GuestAddress(0x3000)).expect("write");
        mem.write_obj(0x22u8, GuestAddress(0x20_0000))
            .expect("write");
        let dir = std::env::temp_dir().join(format!("vmm-mem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("dir");
        let path = dir.join("memory");
        let layout = write_memory(&mem, &path).expect("write memory");
        assert_eq!(layout.validate(), Ok(()));
        assert_eq!(layout.data_bytes(), 2 * PAGE, "{:?}", layout.runs);
        let file = open_memory(&path, &layout).expect("open");
        let mapped = map_memory(file.try_clone().expect("dup"), &layout).expect("map");
        verify_memory(&mapped, &file, &layout, &path).expect("verify");
        assert_eq!(
            mapped
                .read_obj::<u8>(GuestAddress(0x20_0000))
                .expect("read"),
            0x22
        );
        // Copy-on-write: the guest's write does not reach the file.
        mapped
            .write_obj(0x33u8, GuestAddress(0x20_0000))
            .expect("write");
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, 0x20_0000).expect("read file");
        assert_eq!(b[0], 0x22);
        // A byte written into a hole is caught.
        let rw = File::options().write(true).open(&path).expect("open rw");
        rw.write_all_at(&[1], 0x10_0000).expect("write hole");
        let mapped = map_memory(file.try_clone().expect("dup"), &layout).expect("map");
        let err = verify_memory(&mapped, &file, &layout, &path).expect_err("hole data");
        assert!(err.to_string().contains("should be a hole"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
