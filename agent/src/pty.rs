//! Pseudo-terminals: opening a master/slave pair through /dev/ptmx (no NSS,
//! no libutil, so it works in a static binary in any image) and resizing.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use sandbox_proto::PtySize;

pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a new pair, both ends close-on-exec, with the given window size.
pub fn open(size: PtySize) -> io::Result<Pty> {
    let master: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/ptmx")?
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which is valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let slave = open_peer(&master)?;
    resize(master.as_fd(), size)?;
    Ok(Pty { master, slave })
}

/// The slave end. TIOCGPTPEER avoids a path lookup in /dev/pts (which may be
/// another devpts instance in a container); older kernels get the path.
fn open_peer(master: &OwnedFd) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes its flags by value and returns a new descriptor.
    let fd = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if fd >= 0 {
        // SAFETY: the ioctl just returned this new descriptor; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let mut index: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through the pointer, valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut index) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(format!("/dev/pts/{index}"))?;
    Ok(slave.into())
}

pub fn resize(master: BorrowedFd<'_>, size: PtySize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize through the pointer, valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &winsize) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
