//! Attaching to an existing persistent tap by name: `/dev/net/tun`,
//! TUNSETIFF with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, then
//! TUNSETVNETHDRSZ = 12. A name with no tap behind it would make TUNSETIFF
//! create a throwaway tap (as root), so a tap that is not persistent after
//! attaching is refused: the daemon owns the tap and its addresses.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use super::VNET_HDR_LEN;

/// Longest interface name (IFNAMSIZ less the NUL).
pub const MAX_TAP_NAME_LEN: usize = 15;

const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const IFF_PERSIST: i16 = 0x0800;
// _IOW('T', 202, int), _IOR('T', 210, unsigned int), _IOW('T', 216, int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

/// `struct ifreq` as TUNSETIFF/TUNGETIFF use it: the name, then the flags
/// (a short) at the start of the 24-byte union.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

/// Why a tap could not be attached; each message names the tap.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// Empty, too long, or with characters an interface name cannot have.
    #[error(
        "tap name `{0}` is invalid: --net needs an interface name of 1 to {MAX_TAP_NAME_LEN} \
         bytes without `/`, `:`, `,`, whitespace or NUL"
    )]
    BadName(String),
    /// /dev/net/tun could not be opened.
    #[error("cannot open /dev/net/tun for tap {name}: {source}; the vmm needs the tun driver and access to /dev/net/tun")]
    OpenTun {
        /// The tap.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// TUNSETIFF failed.
    #[error(
        "cannot attach to tap {name}: {source}; create it first as a persistent tap \
         (`ip tuntap add dev {name} mode tap vnet_hdr`) in the vmm's network namespace, and \
         make sure no other process has it open"
    )]
    Attach {
        /// The tap.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The name had no persistent tap behind it.
    #[error(
        "there is no persistent tap named {0} in the vmm's network namespace: create it \
         (TUNSETIFF + TUNSETPERSIST, or `ip tuntap add dev {0} mode tap vnet_hdr`) before \
         starting the vmm"
    )]
    NotPersistent(String),
    /// TUNSETVNETHDRSZ or TUNGETIFF failed.
    #[error("cannot configure tap {name}: {source}")]
    Configure {
        /// The tap.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Checks an interface name as the kernel would (dev_valid_name), plus `,`
/// which the `--net` syntax reserves.
pub fn check_name(name: &str) -> Result<(), TapError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TAP_NAME_LEN
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == b',' || b == 0 || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(TapError::BadName(name.to_owned()))
    }
}

/// Opens the persistent tap `name` (non-blocking, close-on-exec) with a
/// 12-byte vnet header on every frame.
pub fn open_tap(name: &str) -> Result<File, TapError> {
    check_name(name)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|source| TapError::OpenTun {
            name: name.to_owned(),
            source,
        })?;
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads (and may update) one `struct ifreq`, which
    // `req` is in layout and size (40 bytes), and it lives for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(TapError::Attach {
            name: name.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    let configure = |source| TapError::Configure {
        name: name.to_owned(),
        source,
    };
    // SAFETY: TUNGETIFF writes one `struct ifreq` into `req`, valid for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNGETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(configure(io::Error::last_os_error()));
    }
    if req.flags & IFF_PERSIST == 0 {
        // We created it; closing `file` deletes it again.
        return Err(TapError::NotPersistent(name.to_owned()));
    }
    let size: libc::c_int = VNET_HDR_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer, valid for the call.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            TUNSETVNETHDRSZ,
            &size as *const libc::c_int,
        )
    };
    if rc < 0 {
        return Err(configure(io::Error::last_os_error()));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_is_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }

    #[test]
    fn names_are_checked_before_anything_is_opened() {
        for bad in [
            "",
            "0123456789abcdef",
            "a/b",
            "a b",
            "a,b",
            "a:b",
            ".",
            "..",
        ] {
            assert!(
                matches!(open_tap(bad), Err(TapError::BadName(_))),
                "{bad:?}"
            );
        }
        check_name("tap0").expect("tap0");
        check_name("0123456789abcde").expect("15 bytes");
    }
}
