//! The ELF notes that choose a boot protocol: the test guest's `sandboxd`
//! note (it wants the private boot-info block, vmm/guest/note.S) and the PVH
//! ABI's `Xen` XEN_ELFNOTE_PHYS32_ENTRY note (a Linux vmlinux built with
//! CONFIG_PVH names its 32-bit entry point with it). Parsing works on bytes
//! the caller read from PT_NOTE segments, is bounded by them, and never
//! fails: a truncated or malformed note ends the scan, since notes the VMM
//! does not understand must not stop a kernel from booting.

/// Owner of the test guest's note.
pub const SANDBOXD_NOTE_NAME: &[u8] = b"sandboxd";
/// Type of the test guest's note: "boot me with the boot-info block";
/// its 4-byte descriptor is the block version it reads
/// (vmm/guest/boot_info.h, SANDBOXD_NOTE_BOOT_INFO).
pub const SANDBOXD_NOTE_BOOT_INFO: u32 = 1;
/// Owner of the PVH entry note.
pub const XEN_NOTE_NAME: &[u8] = b"Xen";
/// XEN_ELFNOTE_PHYS32_ENTRY (xen/include/public/elfnote.h): the 32-bit
/// physical entry point of the PVH boot ABI.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// Most bytes read from one PT_NOTE segment. Linux's are a few hundred
/// bytes; the cap bounds what a hostile image can make the VMM read.
pub const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

/// What the notes of an image ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootNotes {
    /// The boot-info version from a `sandboxd` note, if there is one.
    pub sandboxd_boot_info: Option<u32>,
    /// The PVH 32-bit entry point from a `Xen` PHYS32_ENTRY note.
    pub pvh_entry: Option<u32>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn align4(n: usize) -> Option<usize> {
    Some(n.checked_add(3)? & !3)
}

/// Adds what the notes in `segment` (the contents of one PT_NOTE segment)
/// ask for to `found`; the first note of each kind wins.
pub fn scan(segment: &[u8], found: &mut BootNotes) {
    let mut at = 0usize;
    // Each note: namesz, descsz, type (u32 each), then the name and the
    // descriptor, each padded to 4 bytes (ELF64 notes on x86_64 use 4-byte
    // alignment, as Linux's and the test guest's do).
    while let (Some(namesz), Some(descsz), Some(kind)) = (
        u32_at(segment, at),
        u32_at(segment, at.saturating_add(4)),
        u32_at(segment, at.saturating_add(8)),
    ) {
        let name_at = at + 12;
        let Some(desc_at) = align4(name_at.saturating_add(namesz as usize)) else {
            return;
        };
        let Some(next) = align4(desc_at.saturating_add(descsz as usize)) else {
            return;
        };
        let (Some(name), Some(desc)) = (
            segment.get(name_at..name_at + namesz as usize),
            segment.get(desc_at..desc_at + descsz as usize),
        ) else {
            return;
        };
        // The name includes its terminator; compare without it.
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        if name == SANDBOXD_NOTE_NAME && kind == SANDBOXD_NOTE_BOOT_INFO {
            found.sandboxd_boot_info = found.sandboxd_boot_info.or(u32_at(desc, 0));
        } else if name == XEN_NOTE_NAME && kind == XEN_ELFNOTE_PHYS32_ENTRY {
            // Linux writes it as a 4-byte `.long`, some builds pad it to 8;
            // the entry is the low 4 bytes either way.
            found.pvh_entry = found.pvh_entry.or(u32_at(desc, 0));
        }
        at = next;
    }
}

/// Builds one note, as a linker would lay it out (tests in this crate).
#[cfg(test)]
pub(crate) fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(name);
    out.push(0);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out.extend_from_slice(desc);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(segment: &[u8]) -> BootNotes {
        let mut found = BootNotes::default();
        scan(segment, &mut found);
        found
    }

    #[test]
    fn finds_the_sandboxd_and_pvh_notes_among_others() {
        let mut seg = note(b"GNU", 3, &[0xaa; 20]);
        seg.extend(note(b"Xen", 6, b"linux\0"));
        // An 8-byte PHYS32_ENTRY descriptor, as Debian's 6.1 vmlinux has.
        seg.extend(note(
            b"Xen",
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x0100_0850u64.to_le_bytes(),
        ));
        assert_eq!(
            scanned(&seg),
            BootNotes {
                sandboxd_boot_info: None,
                pvh_entry: Some(0x0100_0850)
            }
        );
        seg.extend(note(
            b"sandboxd",
            SANDBOXD_NOTE_BOOT_INFO,
            &2u32.to_le_bytes(),
        ));
        assert_eq!(scanned(&seg).sandboxd_boot_info, Some(2));
    }

    #[test]
    fn wrong_owner_or_type_is_not_a_match() {
        let mut seg = note(b"Xenx", XEN_ELFNOTE_PHYS32_ENTRY, &[1, 0, 0, 0]);
        seg.extend(note(b"Xen", 17, &[1, 0, 0, 0]));
        seg.extend(note(b"sandbox", SANDBOXD_NOTE_BOOT_INFO, &[2, 0, 0, 0]));
        assert_eq!(scanned(&seg), BootNotes::default());
    }

    #[test]
    fn truncated_and_hostile_notes_end_the_scan_without_panicking() {
        let good = note(b"Xen", XEN_ELFNOTE_PHYS32_ENTRY, &[0x50, 0x08, 0, 1]);
        for cut in 0..good.len() {
            // Cut anywhere before the descriptor's end: nothing found.
            let found = scanned(&good[..cut]);
            assert_eq!(found.pvh_entry, None, "cut at {cut}");
        }
        // A short descriptor is no entry point.
        assert_eq!(
            scanned(&note(b"Xen", XEN_ELFNOTE_PHYS32_ENTRY, &[1, 2])),
            BootNotes::default()
        );
        // Sizes near u32::MAX must not overflow or loop.
        let mut huge = Vec::new();
        for v in [u32::MAX, u32::MAX, XEN_ELFNOTE_PHYS32_ENTRY] {
            huge.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(scanned(&huge), BootNotes::default());
        assert_eq!(scanned(&[0u8; 64]), BootNotes::default());
    }
}
