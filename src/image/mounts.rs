//! Detaches mounts a recipe left inside its build directory (a chroot's /proc, say),
//! so that deleting or shifting the tree never reaches into another file system.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags};

/// Lazily unmounts every mount at or below `dir` (deepest first). Returns how many.
pub(crate) fn detach_below(dir: &Path) -> usize {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let mut targets: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|p| p.starts_with(dir))
        .collect();
    targets.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    let mut n = 0;
    for t in targets {
        match umount2(&t, MntFlags::MNT_DETACH) {
            Ok(()) => n += 1,
            Err(e) => {
                tracing::warn!(path = %t.display(), error = %e, "cannot detach mount left by a recipe")
            }
        }
    }
    n
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u16, |acc, c| acc * 8 + u16::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(byte) = octal {
            out.push(byte);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        use std::path::Path;
        assert_eq!(super::unescape(r"/a\040b\134c"), Path::new(r"/a b\c"));
        assert_eq!(super::unescape("/plain"), Path::new("/plain"));
        assert_eq!(super::unescape(r"/end\04"), Path::new(r"/end\04"));
    }
}
