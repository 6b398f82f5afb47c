//! Destinations that no policy can open (there is deliberately no switch to
//! turn this off): loopback, private and unique-local, link-local, CGNAT,
//! multicast, unspecified, broadcast, reserved ranges, cloud metadata
//! addresses, the host's own interface addresses, and the IPv4-mapped,
//! -compatible, NAT64 and 6to4 IPv6 spellings of all of them. Documentation
//! ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) are
//! *not* denied: tests use them as public upstreams.
//!
//! An address is compared in its canonical form ([`crate::net::host`], which
//! also reads the odd spellings a client may send), so that the IPv4-mapped
//! spelling of a host address is refused like the address itself.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::net::host::canonical_ip;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DenyReason {
    #[error("unspecified address")]
    Unspecified,
    #[error("\"this network\" address (0.0.0.0/8)")]
    ThisNetwork,
    #[error("loopback address")]
    Loopback,
    #[error("private address (RFC 1918)")]
    Private,
    #[error("unique local IPv6 address (fc00::/7)")]
    UniqueLocal,
    #[error("site-local IPv6 address (fec0::/10)")]
    SiteLocal,
    #[error("shared address space (CGNAT, 100.64.0.0/10)")]
    Cgnat,
    #[error("link-local address")]
    LinkLocal,
    #[error("cloud metadata address")]
    Metadata,
    #[error("multicast address")]
    Multicast,
    #[error("broadcast address")]
    Broadcast,
    #[error("reserved address range")]
    Reserved,
    #[error("IETF protocol assignment range")]
    IetfProtocol,
    #[error("benchmarking range (198.18.0.0/15)")]
    Benchmarking,
    #[error("deprecated IPv4-compatible IPv6 address")]
    Ipv4Compatible,
    #[error("Teredo or other tunnel address")]
    Tunnel,
    #[error("one of this host's own addresses")]
    HostInterface,
}

fn in4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn in6(ip: Ipv6Addr, net: u128, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == net & mask
}

fn v4_reason(ip: Ipv4Addr) -> Option<DenyReason> {
    use DenyReason::*;
    let o = ip.octets();
    if o == [169, 254, 169, 254] || o == [100, 100, 100, 200] || o == [192, 0, 0, 192] {
        // AWS/GCP/Azure/OpenStack, Alibaba, Oracle.
        return Some(Metadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    let table: &[([u8; 4], u32, DenyReason)] = &[
        ([0, 0, 0, 0], 8, ThisNetwork),
        ([127, 0, 0, 0], 8, Loopback),
        ([10, 0, 0, 0], 8, Private),
        ([172, 16, 0, 0], 12, Private),
        ([192, 168, 0, 0], 16, Private),
        ([100, 64, 0, 0], 10, Cgnat),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([192, 0, 0, 0], 24, IetfProtocol),
        ([198, 18, 0, 0], 15, Benchmarking),
        ([224, 0, 0, 0], 4, Multicast),
        ([255, 255, 255, 255], 32, Broadcast),
        ([240, 0, 0, 0], 4, Reserved),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in4(ip, *net, *prefix))
        .map(|(_, _, reason)| *reason)
}

fn embedded_v4(bits: u128, shift: u32) -> Ipv4Addr {
    Ipv4Addr::from(((bits >> shift) & 0xffff_ffff) as u32)
}

/// AWS's IPv6 instance metadata address, fd00:ec2::254.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

fn v6_reason(ip: Ipv6Addr) -> Option<DenyReason> {
    use DenyReason::*;
    let bits = u128::from(ip);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_reason(v4);
    }
    if ip == AWS_METADATA_V6 {
        return Some(Metadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    // ::a.b.c.d (IPv4-compatible, deprecated): refused, naming the embedded
    // address's reason when it has one.
    if bits >> 32 == 0 {
        return Some(v4_reason(embedded_v4(bits, 0)).unwrap_or(Ipv4Compatible));
    }
    // NAT64 well-known prefix: the embedded IPv4 address decides.
    if in6(ip, 0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        return v4_reason(embedded_v4(bits, 0));
    }
    // 6to4: 2002:AABB:CCDD::/48 embeds AA.BB.CC.DD.
    if in6(ip, 0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
        return v4_reason(embedded_v4(bits, 80));
    }
    let table: &[(u128, u32, DenyReason)] = &[
        (0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48, Reserved), // local-use NAT64
        (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, Reserved), // discard-only
        (0x2001_0000_0000_0000_0000_0000_0000_0000, 32, Tunnel),   // Teredo
        (0x2001_0000_0000_0000_0000_0000_0000_0000, 23, IetfProtocol),
        (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7, UniqueLocal),
        (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10, LinkLocal),
        (0xfec0_0000_0000_0000_0000_0000_0000_0000, 10, SiteLocal),
        (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, Multicast),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in6(ip, *net, *prefix))
        .map(|(_, _, reason)| *reason)
}

/// The fixed part of the deny list: refused on every host, whatever the
/// policy. `None` means the address may be dialled if the policy allows it.
pub fn always_denied(ip: IpAddr) -> Option<DenyReason> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// The full deny list: the fixed ranges plus this host's own addresses.
#[derive(Debug, Clone, Default)]
pub struct DenyList {
    host_addrs: HashSet<IpAddr>,
}

impl DenyList {
    /// `host_addrs`: the addresses of the interfaces in the namespace the
    /// proxy dials from (see [`host_interface_addresses`]).
    pub fn new(host_addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        DenyList {
            host_addrs: host_addrs.into_iter().map(canonical_ip).collect(),
        }
    }

    /// Why `ip` is refused, or `None` when it is not.
    pub fn check(&self, ip: IpAddr) -> Option<DenyReason> {
        if let Some(reason) = always_denied(ip) {
            return Some(reason);
        }
        if self.host_addrs.contains(&canonical_ip(ip)) {
            return Some(DenyReason::HostInterface);
        }
        None
    }

    pub fn denies(&self, ip: IpAddr) -> bool {
        self.check(ip).is_some()
    }
}

/// The addresses of every interface in the calling thread's network
/// namespace (getifaddrs(3)).
pub fn host_interface_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`; it is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says its real type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference
    // into the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::host::{parse_host, HostPort, HostSpec};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn fixed_ranges_are_denied() {
        let cases = [
            ("127.0.0.1", DenyReason::Loopback),
            ("127.255.255.254", DenyReason::Loopback),
            ("10.0.0.1", DenyReason::Private),
            ("172.16.0.1", DenyReason::Private),
            ("172.31.255.255", DenyReason::Private),
            ("192.168.1.1", DenyReason::Private),
            ("100.64.0.1", DenyReason::Cgnat),
            ("100.127.255.255", DenyReason::Cgnat),
            ("169.254.1.1", DenyReason::LinkLocal),
            ("169.254.169.254", DenyReason::Metadata),
            ("100.100.100.200", DenyReason::Metadata),
            ("224.0.0.1", DenyReason::Multicast),
            ("239.255.255.250", DenyReason::Multicast),
            ("0.0.0.0", DenyReason::Unspecified),
            ("0.1.2.3", DenyReason::ThisNetwork),
            ("255.255.255.255", DenyReason::Broadcast),
            ("240.0.0.1", DenyReason::Reserved),
            ("198.18.0.1", DenyReason::Benchmarking),
            ("::", DenyReason::Unspecified),
            ("::1", DenyReason::Loopback),
            ("fd00::1", DenyReason::UniqueLocal),
            ("fc00::1", DenyReason::UniqueLocal),
            ("fd00:ec2::254", DenyReason::Metadata),
            ("fe80::1", DenyReason::LinkLocal),
            ("fec0::1", DenyReason::SiteLocal),
            ("ff02::1", DenyReason::Multicast),
            ("2001::1", DenyReason::Tunnel),
            ("100::1", DenyReason::Reserved),
            // Mapped, compatible, NAT64 and 6to4 spellings.
            ("::ffff:127.0.0.1", DenyReason::Loopback),
            ("::ffff:169.254.169.254", DenyReason::Metadata),
            ("::ffff:10.1.1.1", DenyReason::Private),
            ("::127.0.0.1", DenyReason::Loopback),
            ("::10.0.0.1", DenyReason::Private),
            ("::203.0.113.1", DenyReason::Ipv4Compatible),
            ("64:ff9b::127.0.0.1", DenyReason::Loopback),
            ("64:ff9b::a9fe:a9fe", DenyReason::Metadata),
            ("2002:7f00:1::", DenyReason::Loopback),
            ("2002:c0a8:0101::1", DenyReason::Private),
        ];
        for (addr, reason) in cases {
            assert_eq!(always_denied(ip(addr)), Some(reason), "{addr}");
        }
    }

    #[test]
    fn public_and_documentation_addresses_pass() {
        for addr in [
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.7",
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "2001:db8::1",
            "2606:4700::1111",
            "::ffff:203.0.113.7",
            "64:ff9b::203.0.113.7",
            "2002:cb00:7107::1",
        ] {
            assert_eq!(always_denied(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn host_interfaces_are_denied() {
        let list = DenyList::new([ip("203.0.113.50"), ip("2001:db8::50")]);
        assert_eq!(
            list.check(ip("203.0.113.50")),
            Some(DenyReason::HostInterface)
        );
        assert_eq!(
            list.check(ip("::ffff:203.0.113.50")),
            Some(DenyReason::HostInterface)
        );
        assert_eq!(
            list.check(ip("2001:db8::50")),
            Some(DenyReason::HostInterface)
        );
        assert!(!list.denies(ip("203.0.113.51")));
        assert!(list.denies(ip("127.0.0.1")));
    }

    #[test]
    fn this_hosts_addresses_are_found() {
        let addrs = host_interface_addresses().unwrap();
        // Every namespace has lo; a test host has it up with 127.0.0.1.
        assert!(addrs.contains(&ip("127.0.0.1")), "{addrs:?}");
    }

    fn host_ip(s: &str) -> IpAddr {
        match parse_host(s) {
            Ok(HostPort {
                host: HostSpec::Ip(ip),
                ..
            }) => ip,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    #[test]
    fn every_spelling_of_loopback_is_an_address() {
        let lo = ip("127.0.0.1");
        for s in [
            "127.0.0.1",
            "2130706433",
            "0177.0.0.1",
            "0x7f.1",
            "0x7F.0.0.1",
            "0X7f000001",
            "017700000001",
            "127.1",
            "127.0.1",
            "127.0.0.1.",
            "0x7f.0x0.0x0.0x1",
            "00000177.0.0.01",
            "127.0.0.1:80",
            "2130706433:8080",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]:443",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(host_ip(s), lo, "{s}");
            assert!(DenyList::default().denies(host_ip(s)), "{s}");
        }
        assert_eq!(host_ip("[::1]:8080"), ip("::1"));
        assert_eq!(host_ip("169.254.43518"), ip("169.254.169.254"));
        assert_eq!(host_ip("0xa9fea9fe"), ip("169.254.169.254"));
        assert_eq!(host_ip("0"), ip("0.0.0.0"));
        assert_eq!(host_ip("203.0.113.7"), ip("203.0.113.7"));
    }
}
