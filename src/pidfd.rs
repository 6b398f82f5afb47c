//! Process file descriptors: a handle on one process that a reused pid
//! can never be mistaken for.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd of process `pid` (`ESRCH` once it is gone and reaped).
pub fn open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let raw = i32::try_from(raw).map_err(std::io::Error::other)?;
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Whether the process of `pidfd` has exited, without waiting: a pidfd
/// becomes readable when its process exits.
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut poll = [libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one pollfd that lives across the call, with a zero timeout.
    let ready = unsafe { libc::poll(poll.as_mut_ptr(), 1, 0) };
    ready > 0 && poll[0].revents & (libc::POLLIN | libc::POLLHUP) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_tells_a_live_process_from_one_that_exited() {
        let live = open(std::process::id() as i32).unwrap();
        assert!(!has_exited(&live));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = open(child.id() as i32).unwrap();
        child.wait().unwrap();
        assert!(has_exited(&pidfd));
    }
}
