//! The destination a redirected TCP connection originally asked for, read
//! from conntrack with `getsockopt(SO_ORIGINAL_DST)` (IPv4) or
//! `IP6T_SO_ORIGINAL_DST` (IPv6), and whether the connection was redirected
//! at all (a client that dials the proxy's port directly was not, and is to
//! be refused).

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};

/// The original destination of an accepted connection `sock`. Fails with
/// `ENOENT` when conntrack has no entry for it.
pub fn original_destination(sock: &impl AsFd) -> io::Result<SocketAddr> {
    let fd = sock.as_fd().as_raw_fd();
    let local = local_addr(fd)?;
    // An IPv4 connection accepted on a dual-stack IPv6 socket has an
    // IPv4-mapped local address; conntrack holds it as IPv4.
    let v4 = match local {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    };
    if v4 {
        let mut sin = MaybeUninit::<libc::sockaddr_in>::zeroed();
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `sin` is a writable sockaddr_in of `len` bytes; the kernel
        // writes at most `len` bytes and updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IP,
                libc::SO_ORIGINAL_DST,
                sin.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zero-initialised and (partly) written by the kernel; every
        // bit pattern is a valid sockaddr_in.
        let sin = unsafe { sin.assume_init() };
        Ok(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        )))
    } else {
        let mut sin6 = MaybeUninit::<libc::sockaddr_in6>::zeroed();
        let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        // SAFETY: as above, for a sockaddr_in6.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IPV6,
                libc::IP6T_SO_ORIGINAL_DST,
                sin6.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zero-initialised and written by the kernel; every bit
        // pattern is a valid sockaddr_in6.
        let sin6 = unsafe { sin6.assume_init() };
        Ok(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(sin6.sin6_addr.s6_addr),
            u16::from_be(sin6.sin6_port),
            sin6.sin6_flowinfo,
            sin6.sin6_scope_id,
        )))
    }
}

fn local_addr(fd: libc::c_int) -> io::Result<IpAddr> {
    let mut ss = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss` is a writable sockaddr_storage of `len` bytes.
    if unsafe { libc::getsockname(fd, ss.as_mut_ptr().cast(), &mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised and written by the kernel.
    let ss = unsafe { ss.assume_init() };
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, and
            // sockaddr_storage is large and aligned enough for it.
            let sin =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Ok(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Ok(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an IPv4 or IPv6 socket",
        )),
    }
}

/// Whether a connection accepted on `local` had been redirected there: its
/// original destination differs from where it landed. A client that connects
/// straight to the proxy's address and port was not redirected.
pub fn was_redirected(local: SocketAddr, original: SocketAddr) -> bool {
    let canon = |a: SocketAddr| (crate::net::host::canonical_ip(a.ip()), a.port());
    canon(local) != canon(original)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_connections_are_not_redirected() {
        let l: SocketAddr = "127.0.0.1:15001".parse().unwrap();
        assert!(!was_redirected(l, l));
        assert!(!was_redirected(
            l,
            "[::ffff:127.0.0.1]:15001".parse().unwrap()
        ));
        assert!(was_redirected(l, "203.0.113.7:443".parse().unwrap()));
        assert!(was_redirected(l, "127.0.0.1:443".parse().unwrap()));
    }

    #[test]
    fn unredirected_socket_has_no_original_destination_or_its_own() {
        // Without NAT, conntrack (if loaded) reports the address itself, and
        // without conntrack the call fails with ENOENT: either way it is not
        // a redirect.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        match original_destination(&server) {
            Ok(orig) => assert!(!was_redirected(addr, orig), "{orig}"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}"),
        }
    }
}
