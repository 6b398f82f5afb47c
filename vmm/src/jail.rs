//! Dropping the VMM's privileges before any guest code runs: the daemon
//! starts `vmm` as root (to open /dev/kvm, the kernel, the disks and bind its
//! sockets in the sandbox's run directory); once the VM is built the process
//! chroots into that directory, so the only files it can name are its own
//! sockets, console and snapshot directory, and becomes an unprivileged
//! uid/gid with no supplementary groups. The seccomp filter comes after
//! this. What it still needs from outside the directory, it opens first:
//! `/proc/self/pagemap` for snapshots.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The jail: where to chroot and who to become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jail {
    /// The new root.
    pub dir: PathBuf,
    /// The uid and gid to run as (not 0).
    pub uid: u32,
    /// The gid.
    pub gid: u32,
}

/// Why the VMM could not jail itself (it then exits: a VMM must never run a
/// guest with more privileges than asked).
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// uid or gid 0 asked for.
    #[error("--uid and --gid must not be 0: the jail is for dropping root")]
    Root,
    /// A step failed.
    #[error("cannot {step} for the jail {}: {source}", dir.display())]
    Step {
        /// What failed.
        step: &'static str,
        /// The jail directory.
        dir: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Privileges came back after being dropped.
    #[error("the VMM could regain root after dropping it; refusing to run the guest")]
    Regained,
}

static PAGEMAP: OnceLock<File> = OnceLock::new();

/// `/proc/self/pagemap`, opened before the jail hid /proc.
pub fn pagemap() -> io::Result<File> {
    match PAGEMAP.get() {
        Some(f) => f.try_clone(),
        None => File::open("/proc/self/pagemap"),
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Jail {
    /// Enters the jail for the whole process (every thread: chroot and
    /// credentials are process-wide; glibc broadcasts setres[ug]id).
    pub fn enter(&self) -> Result<(), JailError> {
        if self.uid == 0 || self.gid == 0 {
            return Err(JailError::Root);
        }
        let step = |step: &'static str| {
            let dir = self.dir.clone();
            move |source| JailError::Step { step, dir, source }
        };
        if PAGEMAP.get().is_none() {
            let f = File::open("/proc/self/pagemap").map_err(step("open /proc/self/pagemap"))?;
            let _ = PAGEMAP.set(f);
        }
        let dir = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())
            .map_err(|_| step("name")(io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: chroot and chdir take a NUL-terminated path that outlives
        // the calls.
        check(unsafe { libc::chroot(dir.as_ptr()) }).map_err(step("chroot"))?;
        // SAFETY: as above, with a static path.
        check(unsafe { libc::chdir(c"/".as_ptr()) }).map_err(step("chdir"))?;
        // SAFETY: setgroups with a count of 0 reads no memory.
        check(unsafe { libc::setgroups(0, std::ptr::null()) }).map_err(step("drop groups"))?;
        // SAFETY: plain integer arguments.
        check(unsafe { libc::setresgid(self.gid, self.gid, self.gid) })
            .map_err(step("set the gid"))?;
        // SAFETY: plain integer arguments.
        check(unsafe { libc::setresuid(self.uid, self.uid, self.uid) })
            .map_err(step("set the uid"))?;
        // SAFETY: setuid(0) only tests whether root can be regained.
        if unsafe { libc::setuid(0) } == 0 {
            return Err(JailError::Regained);
        }
        Ok(())
    }

    /// `path` as the jailed VMM names it (relative to the jail's root), if
    /// it is inside the jail.
    pub fn inner_path(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.dir)
            .ok()
            .map(|p| Path::new("/").join(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_refused_and_paths_map_into_the_jail() {
        let jail = Jail {
            dir: "/run/x/vm".into(),
            uid: 0,
            gid: 5,
        };
        assert!(matches!(jail.enter(), Err(JailError::Root)));
        assert_eq!(
            jail.inner_path(Path::new("/run/x/vm/snap")),
            Some(PathBuf::from("/snap"))
        );
        assert_eq!(jail.inner_path(Path::new("/etc")), None);
    }
}
