//! Disks for microVMs: an image's read-only ext4 file, made once from its
//! cached directory with `mkfs.ext4 -d` and shared by every VM of the image,
//! and a sandbox's empty writable scratch disk.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};

#[derive(Debug, thiserror::Error)]
pub enum Ext4Error {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mkfs.ext4 failed for {}: {message}; is e2fsprogs installed?", path.display())]
    Mkfs { path: PathBuf, message: String },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Ext4Error + 'a {
    move |source| Ext4Error::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Free room in an image's ext4 beyond its files, so metadata fits.
const IMAGE_HEADROOM_BYTES: u64 = 64 << 20;

/// Bytes used by the files under `dir` (apparent sizes, whole blocks).
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            total += meta.len().div_ceil(4096) * 4096 + 4096;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

fn mkfs(target: &Path, extra: &[&std::ffi::OsStr]) -> Result<(), Ext4Error> {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"])
        .args(extra)
        .arg(target)
        .output()
        .map_err(|e| Ext4Error::Mkfs {
            path: target.to_path_buf(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Ext4Error::Mkfs {
            path: target.to_path_buf(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// The read-only ext4 file of the image whose tree is `rootfs`
/// (`<rootfs>.ext4`), made on first use under a lock.
pub fn ensure_ext4(rootfs: &Path) -> Result<PathBuf, Ext4Error> {
    let target = rootfs.with_extension("ext4");
    if target.is_file() {
        return Ok(target);
    }
    let lock_path = rootfs.with_extension("ext4.lock");
    let lock = File::create(&lock_path).map_err(io_err("creating", &lock_path))?;
    let _lock = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| io_err("locking", &lock_path)(e.into()))?;
    if target.is_file() {
        return Ok(target);
    }
    let partial = rootfs.with_extension("ext4.partial");
    let size = tree_bytes(rootfs) * 5 / 4 + IMAGE_HEADROOM_BYTES;
    let file = File::create(&partial).map_err(io_err("creating", &partial))?;
    file.set_len(size).map_err(io_err("sizing", &partial))?;
    drop(file);
    mkfs(
        &partial,
        &[
            "-d".as_ref(),
            rootfs.as_os_str(),
            "-O".as_ref(),
            "^has_journal".as_ref(),
        ],
    )?;
    fs::set_permissions(
        &partial,
        std::os::unix::fs::PermissionsExt::from_mode(0o444),
    )
    .map_err(io_err("protecting", &partial))?;
    fs::rename(&partial, &target).map_err(io_err("installing", &target))?;
    Ok(target)
}

/// A sparse, freshly formatted writable disk of `size_bytes` at `path`.
pub fn make_scratch(path: &Path, size_bytes: u64) -> Result<(), Ext4Error> {
    let file = File::create(path).map_err(io_err("creating", path))?;
    file.set_len(size_bytes).map_err(io_err("sizing", path))?;
    drop(file);
    mkfs(path, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_tree_becomes_a_read_only_ext4_once() {
        let dir = std::env::temp_dir().join(format!("ext4-test-{}", std::process::id()));
        let rootfs = dir.join("rootfs");
        fs::create_dir_all(rootfs.join("etc")).expect("mkdir");
        fs::write(rootfs.join("etc/hostname"), "x\n").expect("write");
        let made = match ensure_ext4(&rootfs) {
            Ok(p) => p,
            Err(Ext4Error::Mkfs { message, .. }) if message.contains("No such file") => {
                eprintln!("skipping: mkfs.ext4 is not installed");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let bytes = fs::read(&made).expect("read");
        // The ext4 superblock's magic, 56 bytes into the superblock at 1024.
        assert_eq!(&bytes[1024 + 56..1024 + 58], &[0x53, 0xef]);
        let mtime = fs::metadata(&made)
            .and_then(|m| m.modified())
            .expect("mtime");
        assert_eq!(ensure_ext4(&rootfs).expect("again"), made);
        assert_eq!(
            fs::metadata(&made)
                .and_then(|m| m.modified())
                .expect("mtime"),
            mtime
        );
        let scratch = dir.join("scratch");
        make_scratch(&scratch, 64 << 20).expect("scratch");
        assert_eq!(fs::metadata(&scratch).expect("meta").len(), 64 << 20);
        let _ = fs::remove_dir_all(&dir);
    }
}
