//! The `lowerdir=` option of an overlay mount over an image's layers. The
//! kernel reads mount options from one page, so a long stack of long paths
//! (a pulled image's layers under `<images_dir>/oci/layers/<64 hex>`) does
//! not fit past about 35 layers. Past a safe length each layer is spelled
//! `/proc/self/fd/N` of a descriptor opened here, which the caller keeps
//! open until the mount is made.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Beyond this the option is spelled with descriptors (the page is 4096
/// bytes and `upperdir=`/`workdir=` share it).
const MAX_PLAIN: usize = 2048;

/// `dirs` (top first) as the value of `lowerdir=`, and the descriptors it
/// names (keep them until the mount returns).
pub fn lowerdir_value(dirs: &[&Path]) -> std::io::Result<(String, Vec<OwnedFd>)> {
    let plain: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let plain = plain.join(":");
    if plain.len() <= MAX_PLAIN && !plain.contains(',') {
        return Ok((plain, Vec::new()));
    }
    let mut fds = Vec::with_capacity(dirs.len());
    let mut names = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        names.push(format!("/proc/self/fd/{}", file.as_raw_fd()));
        fds.push(OwnedFd::from(file));
    }
    Ok((names.join(":"), fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::mount::{mount, umount2, MntFlags, MsFlags};

    #[test]
    fn a_short_stack_is_spelled_as_paths() {
        let (value, fds) = lowerdir_value(&[Path::new("/a"), Path::new("/b")]).unwrap();
        assert_eq!(value, "/a:/b");
        assert!(fds.is_empty());
    }

    #[test]
    fn a_stack_of_a_hundred_long_paths_mounts() {
        if !nix::unistd::geteuid().is_root() {
            sandboxd_test_support::note_skip!(
                sandboxd_test_support::Reason::NotRoot,
                "needs root (overlay mount)"
            );
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("x".repeat(60));
        let dirs: Vec<_> = (0..100)
            .map(|i| {
                let dir = deep.join(format!("{i:03}-{}", "h".repeat(60)));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(format!("file{i}")), format!("{i}")).unwrap();
                dir
            })
            .collect();
        let refs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
        let (value, fds) = lowerdir_value(&refs).unwrap();
        assert_eq!(fds.len(), 100, "spelled with descriptors");
        let target = tmp.path().join("merged");
        std::fs::create_dir(&target).unwrap();
        let options = format!("lowerdir={value}");
        mount(
            Some("overlay"),
            &target,
            Some("overlay"),
            MsFlags::MS_RDONLY,
            Some(options.as_str()),
        )
        .expect("mount 100 layers");
        drop(fds);
        let seen = std::fs::read_to_string(target.join("file0")).unwrap()
            + &std::fs::read_to_string(target.join("file99")).unwrap();
        umount2(&target, MntFlags::MNT_DETACH).unwrap();
        assert_eq!(seen, "099");
    }
}
