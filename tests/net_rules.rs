//! Root-only: the sandbox namespace plumbing and nftables rules, checked by
//! listing them and by watching real connections get redirected. Every
//! packet stays inside network namespaces these tests create; nothing
//! leaves the machine. Without root (or without nft) each test prints why
//! it skipped and passes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sandboxd::net::origdst::{original_destination, was_redirected};
use sandboxd::net::plumbing::{self, in_netns};
use sandboxd::net::{netns, rules};
use serde_json::{json, Value};

const PROXY_PORT: u16 = 15001;
const DNS_PORT: u16 = 15353;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, nftables)".into());
    }
    let nft_found = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !nft_found {
        return Some("nft is not installed".into());
    }
    None
}

macro_rules! root_only {
    () => {
        if let Some(reason) = skip_reason() {
            eprintln!("skipping: {reason}");
            return;
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
        rules::apply(&ns.path, PROXY_PORT, DNS_PORT).unwrap();
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
    rules::apply(&ns.path, PROXY_PORT, DNS_PORT).unwrap();
    let listing = rules::list(&ns.path).unwrap();

    let nat = rules::chain_rules(&listing, "nat_output");
    assert_eq!(nat.len(), 4, "{nat:#?}");
    assert_eq!(nat[0][1], json!({"redirect": {"port": DNS_PORT}}));
    assert_eq!(nat[1][1], json!({"redirect": {"port": DNS_PORT}}));
    assert_eq!(nat[3][1], json!({"redirect": {"port": PROXY_PORT}}));
    let pre = rules::chain_rules(&listing, "nat_prerouting");
    assert_eq!(pre.len(), 4, "{pre:#?}");
    assert_eq!(pre[3][1], json!({"redirect": {"port": PROXY_PORT}}));
    for chain in ["filter_output", "filter_input"] {
        assert_eq!(rules::chain_rules(&listing, chain).len(), 4, "{chain}");
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
