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
    fn the_most_layers_an_image_may_have_mount_with_long_paths() {
        sandboxd_test_support::require_root!("needs root (overlay mount)");
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("x".repeat(60));
        let most = crate::image::oci::MAX_LAYERS;
        let dirs: Vec<_> = (0..most)
            .map(|i| {
                let dir = deep.join(format!("{i:03}-{}", "h".repeat(60)));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(format!("file{i}")), format!("{i}")).unwrap();
                dir
            })
            .collect();
        let refs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
        let (value, fds) = lowerdir_value(&refs).unwrap();
        assert_eq!(fds.len(), most, "spelled with descriptors");
        // Upper and work paths as long as a sandbox's share the page.
        let (upper, work) = (deep.join("u".repeat(120)), deep.join("w".repeat(120)));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let target = tmp.path().join("merged");
        std::fs::create_dir(&target).unwrap();
        let options = format!(
            "lowerdir={value},upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            &target,
            Some("overlay"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .expect("mount the most layers");
        drop(fds);
        let last = most - 1;
        let seen = std::fs::read_to_string(target.join("file0")).unwrap()
            + &std::fs::read_to_string(target.join(format!("file{last}"))).unwrap();
        umount2(&target, MntFlags::MNT_DETACH).unwrap();
        assert_eq!(seen, format!("0{last}"));
    }
}
