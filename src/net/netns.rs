//! Named network namespaces owned by the host's user namespace.
//!
//! The daemon side makes the namespace (not the container runtime), so that
//! root inside a sandbox, which lives in its own user namespace, holds no
//! capability over it and cannot change its interfaces or rules. The
//! namespace is kept alive by a bind mount of its nsfs file. A CRI pod's
//! sandbox [`join`]s the namespace CNI made instead.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("creating a network namespace at {path}: {message}")]
    Create { path: String, message: String },
    #[error("removing network namespace {path}: {message}")]
    Remove { path: String, message: String },
}

/// Creates a fresh network namespace with `lo` up and pins it at `path`.
pub fn create(path: &Path) -> Result<(), NetnsError> {
    let fail = |message: String| NetnsError::Create {
        path: path.display().to_string(),
        message,
    };
    File::create(path).map_err(|e| fail(format!("mount point: {e}")))?;
    let target = path.to_path_buf();
    // unshare(CLONE_NEWNET) changes only the calling thread, so a short-lived
    // thread does it and the caller's namespace stays untouched.
    let result = std::thread::spawn(move || -> Result<(), String> {
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare: {e}"))?;
        loopback_up().map_err(|e| format!("bringing lo up: {e}"))?;
        mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind mount: {e}"))
    })
    .join()
    .map_err(|_| fail("namespace thread panicked".into()))?;
    if let Err(message) = result {
        let _ = std::fs::remove_file(path);
        return Err(fail(message));
    }
    Ok(())
}

/// Pins the existing network namespace `existing` (a CRI pod's, made by
/// CNI) at `path` too, so the sandbox uses it like one of its own; the
/// pin keeps it alive until [`remove`], whoever deletes the original name.
/// The file is opened once and the pin made from that descriptor, so what
/// was checked is what is pinned, whatever replaces the name meanwhile.
pub fn join(existing: &Path, path: &Path) -> Result<(), NetnsError> {
    let fail = |message: String| NetnsError::Create {
        path: path.display().to_string(),
        message,
    };
    let namespace = open_foreign(existing).map_err(fail)?;
    File::create(path).map_err(|e| fail(format!("mount point: {e}")))?;
    let checked = format!("/proc/self/fd/{}", namespace.as_raw_fd());
    if let Err(e) = mount(
        Some(checked.as_str()),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        let _ = std::fs::remove_file(path);
        return Err(fail(format!("bind mount of {}: {e}", existing.display())));
    }
    Ok(())
}

/// Opens `path` if it is a network namespace other than the one this
/// process runs in (the host's, where the daemon and the proxies live: a
/// sandbox never shares it); else says why not.
pub fn open_foreign(path: &Path) -> Result<File, String> {
    use std::os::unix::fs::MetadataExt;
    let not = |why: &str| format!("{} is not a network namespace file: {why}", path.display());
    let file = File::open(path).map_err(|e| not(&e.to_string()))?;
    if !is_network_namespace_fd(&file) {
        return Err(not("another kind of file"));
    }
    let ours = std::fs::metadata("/proc/self/ns/net").map_err(|e| not(&e.to_string()))?;
    let theirs = file.metadata().map_err(|e| not(&e.to_string()))?;
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(format!(
            "{} is the host's own network namespace; a sandbox joins only a pod's",
            path.display()
        ));
    }
    Ok(file)
}

fn is_network_namespace_fd(file: &File) -> bool {
    /// `NS_GET_NSTYPE`: `_IO(0xb7, 0x3)`.
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the type or -1.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE) };
    kind == libc::CLONE_NEWNET
}

/// Unpins and deletes a namespace made by [`create`]; a missing one is fine.
pub fn remove(path: &Path) -> Result<(), NetnsError> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => {
            return Err(NetnsError::Remove {
                path: path.display().to_string(),
                message: e.to_string(),
            })
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NetnsError::Remove {
            path: path.display().to_string(),
            message: e.to_string(),
        }),
    }
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2) call; the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own; File closes it on drop.
    let sock = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = CString::new("lo").map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes_with_nul()) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in req into req.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member written by SIOCGIFFLAGS is ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS applies the flags in req to the named interface.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_pod_namespace_is_pinned_and_the_hosts_own_is_refused() {
        sandboxd_test_support::require_root!("needs root (namespaces, bind mounts)");
        let dir = tempfile::tempdir().unwrap();
        let (pod, pin, host_pin) = (
            dir.path().join("pod"),
            dir.path().join("pin"),
            dir.path().join("host"),
        );
        create(&pod).expect("a pod's namespace");
        join(&pod, &pin).expect("pinned");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&pin), ino(&pod), "the pin is the pod's namespace");
        let refused = join(Path::new("/proc/self/ns/net"), &host_pin).unwrap_err();
        assert!(refused.to_string().contains("host's own"), "{refused}");
        assert!(!host_pin.exists());
        let not_ns = join(Path::new("/etc/hostname"), &host_pin).unwrap_err();
        assert!(
            not_ns.to_string().contains("not a network namespace"),
            "{not_ns}"
        );
        remove(&pin).unwrap();
        remove(&pod).unwrap();
    }
}
