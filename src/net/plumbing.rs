//! The interfaces inside a sandbox's network namespace, made over netlink
//! (`netlink-packet-route`, no `ip` binary): a veth pair whose both ends stay
//! in the namespace, the same private address pair in every sandbox (so
//! forks need no reconfiguration), and a default route via the peer end.
//! The route only exists so that `connect()` to a public address gets as far
//! as the nftables rules, which redirect it to the daemon's sockets; nothing
//! is forwarded anywhere. Also owns [`in_netns`], the way to make a socket
//! (or run any code) inside a namespace without moving the caller.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use netlink_packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::Socket;
use nix::sched::{setns, CloneFlags};

/// The sandbox's end of the veth pair.
pub const SANDBOX_IF: &str = "eth0";
/// The other end, also inside the namespace; the default route points at it.
pub const PEER_IF: &str = "gw0";
/// The sandbox's IPv4 address (on [`SANDBOX_IF`]), the same in every sandbox.
pub const SANDBOX_V4: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The peer's IPv4 address, the sandbox's default gateway.
pub const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const PREFIX_V4: u8 = 30;
/// The sandbox's IPv6 (ULA) address.
pub const SANDBOX_V6: Ipv6Addr = Ipv6Addr::new(0xfd5a, 0xdb0c, 0, 0x200, 0, 0, 0, 2);
/// The peer's IPv6 address, the sandbox's IPv6 default gateway.
pub const PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd5a, 0xdb0c, 0, 0x200, 0, 0, 0, 1);
pub const PREFIX_V6: u8 = 126;

/// A microVM's tap, inside the namespace: the VMM attaches its virtio-net
/// device to it. The host end has [`TAP_HOST_V4`] and [`TAP_HOST_MAC`]; the
/// guest is [`TAP_GUEST_V4`] with [`TAP_GUEST_MAC`], the same in every VM (so
/// forks need no reconfiguration), with a permanent neighbour entry so the
/// host never has to ask the guest.
pub const VM_TAP: &str = "tap0";
pub const TAP_HOST_V4: Ipv4Addr = v4(sandbox_proto::VM_GATEWAY_V4);
pub const TAP_GUEST_V4: Ipv4Addr = v4(sandbox_proto::VM_GUEST_V4);
pub const TAP_HOST_MAC: [u8; 6] = [0x06, 0x00, 0x0a, 0xc9, 0x00, 0x01];
pub const TAP_GUEST_MAC: [u8; 6] = [0x06, 0x00, 0x0a, 0xc9, 0x00, 0x02];

/// What went wrong while setting up a namespace's interfaces.
#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    #[error("entering network namespace {path}: {source} (is it a netns file made by net::netns::create, and are we root?)")]
    Enter { path: String, source: io::Error },
    #[error("netlink {op} failed: {source}")]
    Netlink { op: String, source: io::Error },
    #[error("the namespace worker thread panicked")]
    Panicked,
}

/// Runs `f` on a short-lived thread that has joined the network namespace
/// pinned at `netns`; the caller's own namespace is untouched. Sockets made
/// inside `f` stay in that namespace wherever they are used later.
pub fn in_netns<T, F>(netns: &Path, f: F) -> Result<T, PlumbingError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let enter_err = |source: io::Error| PlumbingError::Enter {
        path: netns.display().to_string(),
        source,
    };
    let file = File::open(netns).map_err(enter_err)?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // setns(CLONE_NEWNET) changes only this thread, which ends
                // when `f` returns.
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| enter_err(e.into()))?;
                drop(file);
                Ok(f())
            })
            .join()
            .map_err(|_| PlumbingError::Panicked)?
    })
}

/// Creates the veth pair inside the namespace at `netns`, brings both ends
/// up, gives them [`SANDBOX_V4`]/[`PEER_V4`] and [`SANDBOX_V6`]/[`PEER_V6`],
/// and adds an IPv4 default route via the peer and an on-link IPv6 default
/// route on [`SANDBOX_IF`].
pub fn setup(netns: &Path) -> Result<(), PlumbingError> {
    in_netns(netns, setup_here)?
}

/// [`setup`] for the calling thread's own namespace.
fn setup_here() -> Result<(), PlumbingError> {
    let mut nl = Netlink::open()?;
    nl.add_veth(SANDBOX_IF, PEER_IF)?;
    let sandbox = if_index(SANDBOX_IF)?;
    let peer = if_index(PEER_IF)?;
    nl.add_address(sandbox, IpAddr::V4(SANDBOX_V4), PREFIX_V4)?;
    nl.add_address(peer, IpAddr::V4(PEER_V4), PREFIX_V4)?;
    nl.add_address(sandbox, IpAddr::V6(SANDBOX_V6), PREFIX_V6)?;
    nl.add_address(peer, IpAddr::V6(PEER_V6), PREFIX_V6)?;
    nl.set_up(peer)?;
    nl.set_up(sandbox)?;
    nl.add_default_route(sandbox, AddressFamily::Inet, Some(IpAddr::V4(PEER_V4)))?;
    // IPv6 refuses a gateway that is a local address, and the peer's is
    // (both ends live here), so the IPv6 default route is on-link.
    nl.add_default_route(sandbox, AddressFamily::Inet6, None)?;
    Ok(())
}

const fn v4(a: [u8; 4]) -> Ipv4Addr {
    Ipv4Addr::new(a[0], a[1], a[2], a[3])
}

/// Makes [`VM_TAP`] in the namespace at `netns`: a persistent tap
/// (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, the flags the VMM attaches with),
/// up, with the host end's address and MAC and the guest's permanent
/// neighbour entry. It goes with the namespace.
pub fn setup_vm_tap(netns: &Path) -> Result<(), PlumbingError> {
    in_netns(netns, || {
        create_persistent_tap(VM_TAP).map_err(|source| PlumbingError::Netlink {
            op: format!("creating tap {VM_TAP}"),
            source,
        })?;
        let mut nl = Netlink::open()?;
        let tap = if_index(VM_TAP)?;
        nl.set_mac(tap, &TAP_HOST_MAC)?;
        nl.add_address(tap, IpAddr::V4(TAP_HOST_V4), sandbox_proto::VM_PREFIX_V4)?;
        nl.set_up(tap)?;
        nl.add_neighbour(tap, TAP_GUEST_V4, &TAP_GUEST_MAC)
    })?
}

/// TUNSETIFF then TUNSETPERSIST on /dev/net/tun, in the calling thread's
/// namespace.
fn create_persistent_tap(name: &str) -> io::Result<()> {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
    const IFF_TAP: libc::c_short = 0x0002;
    const IFF_NO_PI: libc::c_short = 0x1000;
    const IFF_VNET_HDR: libc::c_short = 0x4000;
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "tap name too long",
        ));
    }
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    use std::os::fd::AsRawFd;
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `IfReq`
    // lays out (name, flags, padding to its 40 bytes); it lives for the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TUNSETPERSIST takes an integer argument.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn if_index(name: &str) -> Result<u32, PlumbingError> {
    let err = |source| PlumbingError::Netlink {
        op: format!("looking up interface {name}"),
        source,
    };
    let c = std::ffi::CString::new(name)
        .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(err(io::Error::last_os_error()));
    }
    Ok(index)
}

/// A NETLINK_ROUTE socket in the calling thread's namespace that sends one
/// request at a time and waits for its acknowledgement.
struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    fn open() -> Result<Self, PlumbingError> {
        let err = |source| PlumbingError::Netlink {
            op: "opening a socket".into(),
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(err)?;
        socket.bind_auto().map_err(err)?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Sends `msg` as a create request and waits for the kernel's ack.
    fn request(&mut self, op: &str, msg: RouteNetlinkMessage) -> Result<(), PlumbingError> {
        let err = |source| PlumbingError::Netlink {
            op: op.to_string(),
            source,
        };
        self.seq = self.seq.wrapping_add(1);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.socket.send(&out, 0).map_err(err)?;

        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = self.socket.recv(&mut &mut buf[..], 0).map_err(err)?;
            let mut offset = 0;
            while offset < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..n])
                    .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())))?;
                let len = reply.header.length as usize;
                if reply.header.sequence_number == self.seq {
                    if let NetlinkPayload::Error(e) = reply.payload {
                        return match e.code {
                            None => Ok(()),
                            Some(code) => Err(err(io::Error::from_raw_os_error(-code.get()))),
                        };
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }

    /// Each end is made with one queue each way. Left to the kernel, a
    /// veth gets one per possible CPU and is then cut down to one, and that
    /// cut waits for an RCU grace period (`synchronize_net`) while holding
    /// the host-wide RTNL lock: under a burst of creates, every other
    /// namespace's link, address and route change queued behind it.
    fn add_veth(&mut self, name: &str, peer: &str) -> Result<(), PlumbingError> {
        let one_queue_each_way = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
        let mut peer_msg = LinkMessage::default();
        peer_msg
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        peer_msg.attributes.extend(one_queue_each_way.clone());
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.extend(one_queue_each_way);
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.request(
            &format!("creating veth pair {name}/{peer}"),
            RouteNetlinkMessage::NewLink(msg),
        )
    }

    fn set_up(&mut self, index: u32) -> Result<(), PlumbingError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(
            &format!("bringing up interface {index}"),
            RouteNetlinkMessage::SetLink(msg),
        )
    }

    fn set_mac(&mut self, index: u32, mac: &[u8; 6]) -> Result<(), PlumbingError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.request(
            &format!("setting the MAC of interface {index}"),
            RouteNetlinkMessage::SetLink(msg),
        )
    }

    fn add_neighbour(
        &mut self,
        index: u32,
        addr: Ipv4Addr,
        mac: &[u8; 6],
    ) -> Result<(), PlumbingError> {
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
        };
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
                addr,
            )));
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.request(
            &format!("adding neighbour {addr} on interface {index}"),
            RouteNetlinkMessage::NewNeighbour(msg),
        )
    }

    fn add_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> Result<(), PlumbingError> {
        let mut msg = AddressMessage::default();
        msg.header.family = match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.prefix_len = prefix;
        msg.header.scope = AddressScope::Universe;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Local(addr));
        msg.attributes.push(AddressAttribute::Address(addr));
        if addr.is_ipv6() {
            // Usable at once: no duplicate address detection on a pair that
            // only ever talks to itself.
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        self.request(
            &format!("adding address {addr}/{prefix} to interface {index}"),
            RouteNetlinkMessage::NewAddress(msg),
        )
    }

    fn add_default_route(
        &mut self,
        index: u32,
        family: AddressFamily,
        gateway: Option<IpAddr>,
    ) -> Result<(), PlumbingError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        msg.header.destination_prefix_length = 0;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Static;
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        if let Some(gw) = gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        msg.attributes.push(RouteAttribute::Oif(index));
        let via = gateway.map_or_else(|| format!("dev {SANDBOX_IF}"), |gw| format!("via {gw}"));
        self.request(
            &format!("adding a {family:?} default route {via}"),
            RouteNetlinkMessage::NewRoute(msg),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_a_private_pair() {
        // Both ends share one /30 and one /126.
        let m4 = u32::MAX << (32 - u32::from(PREFIX_V4));
        assert_eq!(u32::from(SANDBOX_V4) & m4, u32::from(PEER_V4) & m4);
        let m6 = u128::MAX << (128 - u32::from(PREFIX_V6));
        assert_eq!(u128::from(SANDBOX_V6) & m6, u128::from(PEER_V6) & m6);
        assert!(SANDBOX_V4.is_private() && SANDBOX_V6.is_unique_local());
        assert!(SANDBOX_IF.len() < 16 && PEER_IF.len() < 16);
    }

    #[test]
    fn a_missing_namespace_is_a_clear_error() {
        let err = in_netns(Path::new("/nonexistent/netns"), || ()).unwrap_err();
        assert!(matches!(err, PlumbingError::Enter { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/netns"));
    }

    #[test]
    fn in_netns_runs_the_closure_and_returns_its_value() {
        // Our own namespace is always joinable by root; others skip.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            sandboxd_test_support::skip!(
                sandboxd_test_support::Reason::NotRoot,
                "needs root to setns"
            );
        }
        let borrowed = String::from("kept");
        let v = in_netns(Path::new("/proc/self/ns/net"), || borrowed.len()).unwrap();
        assert_eq!(v, 4);
    }
}
