//! Root-only: the sandbox namespace plumbing and nftables rules, checked by
//! listing them and by watching real connections get redirected. Every
//! packet stays inside network namespaces these tests create; nothing
//! leaves the machine. Without root (or without nft) each test records why
//! it skipped (sandboxd_test_support::skip!), which fails it under
//! SANDBOXD_TEST_REQUIRE=all.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sandboxd::net::origdst::{original_destination, was_redirected};
use sandboxd::net::plumbing::{self, in_netns};
use sandboxd::net::{netns, rules};
use sandboxd_test_support::{skip, Reason};
use serde_json::{json, Value};

const PROXY_PORT: u16 = 15001;
const DNS_PORT: u16 = 15353;

fn skip_reason() -> Option<(Reason, String)> {
    if !sandboxd_test_support::running_as_root() {
        return Some((
            Reason::NotRoot,
            "needs root (network namespaces, nftables)".into(),
        ));
    }
    let nft_found = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !nft_found {
        return Some((Reason::NoNft, "nft is not installed".into()));
    }
    None
}

macro_rules! root_only {
    () => {
        if let Some((reason, why)) = skip_reason() {
            skip!(reason, "{why}");
        }
    };
}

/// A namespace pinned in a temporary directory, removed on drop.
struct Ns {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ns {
    fn new() -> Ns {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("net");
        netns::create(&path).unwrap();
        Ns { path, _dir: dir }
    }

    /// A sandbox namespace: veth pair, addresses, routes, rules.
    fn sandbox() -> Ns {
        let ns = Ns::new();
        plumbing::setup(&ns.path).unwrap();
        rules::apply(rules::Loader::preferred(), &ns.path, PROXY_PORT, DNS_PORT).unwrap();
        ns
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = netns::remove(&self.path);
    }
}

/// Runs a command inside `ns` (test plumbing only).
fn run_in(ns: &Path, args: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn connect_in(ns: &Path, to: SocketAddr) -> std::io::Result<TcpStream> {
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.write_all(b"hello")?;
        Ok(s)
    })
    .unwrap()
}

fn accept_one(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    listener.set_nonblocking(false).unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 5];
    conn.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    let orig = original_destination(&conn).unwrap();
    (conn, orig)
}

#[test]
fn rules_are_loaded_inside_the_namespace_only() {
    root_only!();
    let ns = Ns::sandbox();
    // Applying twice replaces, not duplicates.
    rules::apply(rules::Loader::preferred(), &ns.path, PROXY_PORT, DNS_PORT).unwrap();
    let listing = rules::list(&ns.path).unwrap();

    let nat = rules::chain_rules(&listing, "nat_output");
    assert_eq!(nat.len(), 5, "{nat:#?}");
    // First, the ingress's TCP to a microVM's guest out of its tap. The
    // listing leaves out the rule's `meta nfproto ipv4` (implied by its
    // `ip daddr`), so the address is its second match here.
    assert_eq!(nat[0][0]["match"]["right"], "tap0", "{nat:#?}");
    assert_eq!(nat[0][1]["match"]["right"], "10.201.0.2", "{nat:#?}");
    assert_eq!(nat[1][1], json!({"redirect": {"port": DNS_PORT}}));
    assert_eq!(nat[2][1], json!({"redirect": {"port": DNS_PORT}}));
    assert_eq!(nat[4][1], json!({"redirect": {"port": PROXY_PORT}}));
    let pre = rules::chain_rules(&listing, "nat_prerouting");
    assert_eq!(pre.len(), 4, "{pre:#?}");
    assert_eq!(pre[3][1], json!({"redirect": {"port": PROXY_PORT}}));
    for (chain, count) in [("filter_output", 5), ("filter_input", 4)] {
        assert_eq!(rules::chain_rules(&listing, chain).len(), count, "{chain}");
    }
    let chains: Vec<&Value> = listing["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("chain"))
        .collect();
    for (name, policy) in [
        ("filter_output", "drop"),
        ("filter_input", "drop"),
        ("filter_forward", "drop"),
    ] {
        let c = chains.iter().find(|c| c["name"] == name).unwrap();
        assert_eq!(c["policy"], policy, "{name}");
    }

    // The host's own ruleset has no such table.
    let host = Command::new("nft")
        .args(["-j", "list", "tables"])
        .output()
        .unwrap();
    let host: Value = serde_json::from_slice(&host.stdout).unwrap_or(json!({}));
    let host_tables: Vec<&Value> = host["nftables"]
        .as_array()
        .map(|a| a.iter().filter_map(|o| o.get("table")).collect())
        .unwrap_or_default();
    assert!(
        !host_tables.iter().any(|t| t["name"] == rules::TABLE),
        "{host_tables:?}"
    );

    // The plumbing is there: both ends inside, addresses, default routes.
    let addrs = run_in(&ns.path, &["ip", "-br", "addr"]);
    assert!(addrs.contains("10.200.0.2/30"), "{addrs}");
    assert!(addrs.contains("10.200.0.1/30"), "{addrs}");
    assert!(addrs.contains("fd5a:db0c:0:200::2/126"), "{addrs}");
    let routes = run_in(&ns.path, &["ip", "route"]);
    assert!(
        routes.contains("default via 10.200.0.1 dev eth0"),
        "{routes}"
    );
    let routes6 = run_in(&ns.path, &["ip", "-6", "route"]);
    assert!(routes6.contains("default dev eth0"), "{routes6}");
}

/// A listing without the kernel's handles, which differ between namespaces.
fn without_handles(listing: &Value) -> Vec<Value> {
    listing["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item.get("metainfo").is_none())
        .map(|item| {
            let mut item = item.clone();
            if let Some(object) = item.as_object_mut().and_then(|o| o.values_mut().next()) {
                if let Some(fields) = object.as_object_mut() {
                    fields.remove("handle");
                }
            }
            item
        })
        .collect()
}

#[test]
fn the_library_and_the_nft_binary_load_and_list_the_same_ruleset() {
    root_only!();
    // install-deps installs nftables, whose nft runs on libnftables1: the
    // daemon loads rules in-process here, not through the fallback.
    assert_eq!(rules::Loader::preferred(), rules::Loader::Library);
    let (by_library, by_binary) = (Ns::new(), Ns::new());
    rules::apply(
        rules::Loader::Library,
        &by_library.path,
        PROXY_PORT,
        DNS_PORT,
    )
    .unwrap();
    rules::apply(rules::Loader::Binary, &by_binary.path, PROXY_PORT, DNS_PORT).unwrap();
    let listed = |ns: &Ns, loader| rules::list_with(loader, &ns.path).unwrap();
    let reference = without_handles(&listed(&by_binary, rules::Loader::Binary));
    // The positive control: the binary's listing holds the whole ruleset.
    assert_eq!(
        rules::chain_rules(&listed(&by_binary, rules::Loader::Binary), "nat_output").len(),
        5
    );
    for (ns, loader) in [
        (&by_library, rules::Loader::Binary),
        (&by_library, rules::Loader::Library),
        (&by_binary, rules::Loader::Library),
    ] {
        assert_eq!(
            without_handles(&listed(ns, loader)),
            reference,
            "{loader:?}"
        );
    }
    // Loading again replaces, through either loader.
    rules::apply(
        rules::Loader::Library,
        &by_binary.path,
        PROXY_PORT,
        DNS_PORT,
    )
    .unwrap();
    assert_eq!(
        without_handles(&listed(&by_binary, rules::Loader::Binary)),
        reference
    );
    // The host's namespace, where the test runs, is untouched.
    let host = Command::new("nft")
        .args(["-j", "list", "tables"])
        .output()
        .unwrap();
    let host: Value = serde_json::from_slice(&host.stdout).unwrap_or(json!({}));
    assert!(
        !host["nftables"]
            .as_array()
            .is_some_and(|a| a.iter().any(|o| o["table"]["name"] == rules::TABLE)),
        "{host}"
    );
}

#[test]
fn both_veth_ends_are_made_with_one_queue_each_way() {
    root_only!();
    let ns = Ns::sandbox();
    for end in [plumbing::SANDBOX_IF, plumbing::PEER_IF] {
        let shown: Value =
            serde_json::from_str(&run_in(&ns.path, &["ip", "-d", "-j", "link", "show", end]))
                .unwrap();
        let link = &shown[0];
        assert_eq!(link["ifname"], end, "{shown}");
        // Made with more and cut down, a veth costs an RCU grace period
        // under the host-wide RTNL lock (see plumbing::add_veth).
        assert_eq!(link["num_tx_queues"], 1, "{shown}");
        assert_eq!(link["num_rx_queues"], 1, "{shown}");
    }
}

#[test]
fn tcp_to_a_public_address_reaches_the_proxy_with_its_original_destination() {
    root_only!();
    let ns = Ns::sandbox();
    let listener = in_netns(&ns.path, || TcpListener::bind(("127.0.0.1", PROXY_PORT)))
        .unwrap()
        .unwrap();
    let local = listener.local_addr().unwrap();

    let target: SocketAddr = "203.0.113.7:443".parse().unwrap();
    let client = connect_in(&ns.path, target).unwrap();
    // The client believes it talks to the address it dialled.
    assert_eq!(client.peer_addr().unwrap(), target);
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, target);
    assert!(was_redirected(local, orig));

    // Any port, and a synthetic DNS address, go the same way.
    for t in ["198.51.100.9:5432", "10.255.0.5:22"] {
        let t: SocketAddr = t.parse().unwrap();
        let _c = connect_in(&ns.path, t).unwrap();
        let (_conn, orig) = accept_one(&listener);
        assert_eq!(orig, t);
    }

    // A connection straight to the proxy's port is not a redirect.
    let _c = connect_in(&ns.path, local).unwrap();
    let (_conn, orig) = accept_one(&listener);
    assert!(!was_redirected(local, orig), "{orig}");
}

#[test]
fn ipv6_is_redirected_the_same_way() {
    root_only!();
    let ns = Ns::sandbox();
    let listener = in_netns(&ns.path, || TcpListener::bind(("::1", PROXY_PORT)))
        .unwrap()
        .unwrap();
    let target: SocketAddr = "[2001:db8::7]:443".parse().unwrap();
    let _c = connect_in(&ns.path, target).unwrap();
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, target);
}

#[test]
fn tokio_listener_made_in_the_namespace_gets_redirected_connections() {
    root_only!();
    let ns = Ns::sandbox();
    let std_listener = in_netns(&ns.path, || TcpListener::bind(("127.0.0.1", PROXY_PORT)))
        .unwrap()
        .unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let path = ns.path.clone();
        let client = tokio::task::spawn_blocking(move || {
            connect_in(&path, "203.0.113.7:443".parse().unwrap())
        });
        let (conn, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            original_destination(&conn).unwrap(),
            "203.0.113.7:443".parse::<SocketAddr>().unwrap()
        );
        client.await.unwrap().unwrap();
    });
}

#[test]
fn dns_is_redirected_and_other_udp_is_dropped() {
    root_only!();
    let ns = Ns::sandbox();
    let dns = in_netns(&ns.path, || UdpSocket::bind(("127.0.0.1", DNS_PORT)))
        .unwrap()
        .unwrap();
    dns.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let (sent, other) = in_netns(&ns.path, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let sent = s.send_to(b"query", "203.0.113.53:53");
        let other = s.send_to(b"leak", "203.0.113.53:9999");
        (sent, other)
    })
    .unwrap();
    assert_eq!(sent.unwrap(), 5);
    let mut buf = [0u8; 16];
    let (n, _) = dns.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"query");
    // The output filter drops the other datagram: sendto reports EPERM.
    let err = other.unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    // And nothing else reached the DNS socket.
    dns.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(dns.recv_from(&mut buf).is_err());
}

#[test]
fn localhost_inside_the_sandbox_is_left_alone() {
    root_only!();
    let ns = Ns::sandbox();
    let listener = in_netns(&ns.path, || TcpListener::bind("127.0.0.1:8080"))
        .unwrap()
        .unwrap();
    let _c = connect_in(&ns.path, "127.0.0.1:8080".parse().unwrap()).unwrap();
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
}

#[test]
fn traffic_arriving_on_an_interface_takes_the_prerouting_path() {
    root_only!();
    // A microVM's tap delivers the guest's packets into the sandbox
    // namespace from outside it; a veth whose other end sits in a "guest"
    // namespace stands in for the tap here.
    let ns = Ns::sandbox();
    let guest = Ns::new();
    let guest_path = guest.path.display().to_string();
    run_in(
        &ns.path,
        &[
            "ip",
            "link",
            "add",
            "vmtap0",
            "type",
            "veth",
            "peer",
            "name",
            "guest0",
            "netns",
            &guest_path,
        ],
    );
    run_in(
        &ns.path,
        &["ip", "addr", "add", "10.201.0.1/30", "dev", "vmtap0"],
    );
    run_in(&ns.path, &["ip", "link", "set", "vmtap0", "up"]);
    run_in(
        &guest.path,
        &["ip", "addr", "add", "10.201.0.2/30", "dev", "guest0"],
    );
    run_in(&guest.path, &["ip", "link", "set", "guest0", "up"]);
    run_in(
        &guest.path,
        &["ip", "route", "add", "default", "via", "10.201.0.1"],
    );

    // Redirects in prerouting go to the incoming interface's address, so
    // the proxy listens on the wildcard address.
    let listener = in_netns(&ns.path, || TcpListener::bind(("0.0.0.0", PROXY_PORT)))
        .unwrap()
        .unwrap();
    let target: SocketAddr = "203.0.113.7:443".parse().unwrap();
    let _c = connect_in(&guest.path, target).unwrap();
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, target);

    // Other traffic from the guest (UDP not to port 53) is dropped.
    let udp = in_netns(&ns.path, || UdpSocket::bind("0.0.0.0:9999"))
        .unwrap()
        .unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    in_netns(&guest.path, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let _ = s.send_to(b"x", "10.201.0.1:9999");
    })
    .unwrap();
    let mut buf = [0u8; 4];
    assert!(udp.recv_from(&mut buf).is_err(), "input filter let UDP in");
}

/// A real tap, as a microVM's VMM holds it: the test writes the guest's
/// Ethernet frames into the tap's file and reads what the namespace sends
/// back, so the packets enter the namespace exactly as a guest's would.
mod tap {
    use std::fs::File;
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    pub const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    pub const GUEST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    const IFF_TAP: libc::c_short = 0x0002;
    const IFF_NO_PI: libc::c_short = 0x1000;

    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }

    /// Creates tap `name` in the calling thread's namespace.
    pub fn open(name: &str) -> File {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .expect("open /dev/net/tun");
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads an ifreq, which `req` is laid out as.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) };
        assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
        file
    }

    fn checksum(chunks: &[&[u8]]) -> u16 {
        let mut sum = 0u32;
        for chunk in chunks {
            for pair in chunk.chunks(2) {
                let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
                sum += u32::from(word);
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    pub struct Segment {
        pub src: (Ipv4Addr, u16),
        pub dst: (Ipv4Addr, u16),
        pub seq: u32,
        pub ack: u32,
        pub flags: u8,
        pub payload: Vec<u8>,
    }

    pub const SYN: u8 = 0x02;
    pub const ACK: u8 = 0x10;
    pub const PSH: u8 = 0x08;

    /// An Ethernet frame from the guest carrying `seg`.
    pub fn frame(seg: &Segment) -> Vec<u8> {
        let mut tcp = Vec::with_capacity(20 + seg.payload.len());
        tcp.extend_from_slice(&seg.src.1.to_be_bytes());
        tcp.extend_from_slice(&seg.dst.1.to_be_bytes());
        tcp.extend_from_slice(&seg.seq.to_be_bytes());
        tcp.extend_from_slice(&seg.ack.to_be_bytes());
        tcp.extend_from_slice(&[5 << 4, seg.flags, 0xff, 0xff, 0, 0, 0, 0]);
        tcp.extend_from_slice(&seg.payload);
        let tcp_len = (tcp.len() as u16).to_be_bytes();
        let pseudo = [
            &seg.src.0.octets()[..],
            &seg.dst.0.octets()[..],
            &[0, 6],
            &tcp_len[..],
        ]
        .concat();
        let sum = checksum(&[&pseudo, &tcp]).to_be_bytes();
        tcp[16..18].copy_from_slice(&sum);
        let total = (20 + tcp.len() as u16).to_be_bytes();
        let mut ip = vec![0x45, 0, total[0], total[1], 0, 1, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&seg.src.0.octets());
        ip.extend_from_slice(&seg.dst.0.octets());
        let sum = checksum(&[&ip]).to_be_bytes();
        ip[10..12].copy_from_slice(&sum);
        [&HOST_MAC[..], &GUEST_MAC[..], &[0x08, 0x00], &ip, &tcp].concat()
    }

    /// The TCP segment in `frame`, if it is IPv4 TCP.
    fn parse(frame: &[u8]) -> Option<Segment> {
        if frame.len() < 54 || frame[12..14] != [0x08, 0x00] || frame[23] != 6 {
            return None;
        }
        let ip = &frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let tcp = ip.get(ihl..)?;
        let addr = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        let word = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
        let long = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        Some(Segment {
            src: (addr(&ip[12..16]), word(&tcp[0..2])),
            dst: (addr(&ip[16..20]), word(&tcp[2..4])),
            seq: long(&tcp[4..8]),
            ack: long(&tcp[8..12]),
            flags: tcp[13],
            payload: Vec::new(),
        })
    }

    pub fn send(tap: &mut File, seg: &Segment) {
        tap.write_all(&frame(seg)).expect("write to the tap");
    }

    /// Reads frames until a TCP segment matches, or panics after 3 s.
    pub fn await_segment(tap: &mut File, want: impl Fn(&Segment) -> bool) -> Segment {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut buf = [0u8; 2048];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no matching segment came out of the tap");
            let mut pfd = libc::pollfd {
                fd: tap.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
            if pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            let n = tap.read(&mut buf).expect("read the tap");
            if let Some(seg) = parse(&buf[..n]) {
                if want(&seg) {
                    return seg;
                }
            }
        }
    }
}

#[test]
fn a_microvm_tap_takes_the_prerouting_path() {
    root_only!();
    use std::net::Ipv4Addr;
    use tap::{Segment, ACK, PSH, SYN};
    let ns = Ns::sandbox();
    let mut dev = in_netns(&ns.path, || tap::open("vmtap0")).unwrap();
    let mac = tap::HOST_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let guest_mac = tap::GUEST_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    run_in(&ns.path, &["ip", "link", "set", "vmtap0", "address", &mac]);
    run_in(
        &ns.path,
        &["ip", "addr", "add", "10.201.0.1/30", "dev", "vmtap0"],
    );
    run_in(&ns.path, &["ip", "link", "set", "vmtap0", "up"]);
    // The VMM knows the guest's MAC; no ARP round trip through the test.
    run_in(
        &ns.path,
        &[
            "ip",
            "neigh",
            "add",
            "10.201.0.2",
            "lladdr",
            &guest_mac,
            "dev",
            "vmtap0",
        ],
    );
    let listener = in_netns(&ns.path, || TcpListener::bind(("0.0.0.0", PROXY_PORT)))
        .unwrap()
        .unwrap();

    // The guest's SYN to a public address comes back as a SYN-ACK from that
    // address: the redirect and its reversal both happened in the namespace.
    let guest = (Ipv4Addr::new(10, 201, 0, 2), 40000);
    let target = (Ipv4Addr::new(203, 0, 113, 7), 443);
    let isn = 1000;
    tap::send(
        &mut dev,
        &Segment {
            src: guest,
            dst: target,
            seq: isn,
            ack: 0,
            flags: SYN,
            payload: Vec::new(),
        },
    );
    let syn_ack = tap::await_segment(&mut dev, |s| s.flags & (SYN | ACK) == SYN | ACK);
    assert_eq!(
        syn_ack.src, target,
        "the SYN-ACK must come from the address the guest dialled"
    );
    assert_eq!(syn_ack.dst, guest);
    assert_eq!(syn_ack.ack, isn + 1);
    tap::send(
        &mut dev,
        &Segment {
            src: guest,
            dst: target,
            seq: isn + 1,
            ack: syn_ack.seq.wrapping_add(1),
            flags: ACK | PSH,
            payload: b"hello".to_vec(),
        },
    );
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, SocketAddr::from(target));

    // Even the namespace's own address is not reachable from the guest:
    // a connection to a port listening there lands at the proxy too.
    let own = in_netns(&ns.path, || TcpListener::bind(("10.201.0.1", 0)))
        .unwrap()
        .unwrap();
    own.set_nonblocking(true).unwrap();
    let own_target = (
        Ipv4Addr::new(10, 201, 0, 1),
        own.local_addr().unwrap().port(),
    );
    let second = (guest.0, 40001);
    tap::send(
        &mut dev,
        &Segment {
            src: second,
            dst: own_target,
            seq: isn,
            ack: 0,
            flags: SYN,
            payload: Vec::new(),
        },
    );
    let syn_ack = tap::await_segment(&mut dev, |s| s.dst == second && s.flags & SYN != 0);
    tap::send(
        &mut dev,
        &Segment {
            src: second,
            dst: own_target,
            seq: isn + 1,
            ack: syn_ack.seq.wrapping_add(1),
            flags: ACK | PSH,
            payload: b"hello".to_vec(),
        },
    );
    let (_conn, orig) = accept_one(&listener);
    assert_eq!(orig, SocketAddr::from(own_target));
    assert!(
        own.accept().is_err(),
        "the guest reached a socket beside the proxy"
    );
}
