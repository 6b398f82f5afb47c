//! The egress tests' "internet": two network namespaces the test makes and
//! removes. `up-*` is the daemon's `upstream_netns` (the proxies dial from
//! it); `srv-*` holds the servers, on documentation addresses, joined to it
//! by a veth pair. The host has no link to either, so a connection that
//! reaches a server proves it left from the upstream namespace. Servers:
//! HTTP on :80 and HTTPS (a test CA) on :443 of [`SERVER_IPS`], and a DNS
//! server on [`DNS_IP`]:53 that is the daemon's `upstream_dns`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Header, Message, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use sandboxd::net::plumbing::in_netns;

use crate::common::ip;

/// The upstream namespace's own address on the link to the servers.
pub const UPSTREAM_IP: &str = "203.0.113.1";
/// The servers' addresses; names resolve to the first unless said.
pub const SERVER_IPS: [&str; 2] = ["203.0.113.10", "203.0.113.11"];
pub const DNS_IP: &str = "203.0.113.53";
/// Where `common/echo.rs` serves (names below resolve here).
pub const ECHO_IP: &str = "203.0.113.20";
/// What every plain request gets back.
pub const BODY: &str = "hello from upstream";
/// `GET /big` returns this many bytes.
pub const BIG_LEN: usize = 3_000_000;

/// Names the test DNS server answers, and their A records. Every other
/// name is NXDOMAIN.
fn zone() -> HashMap<&'static str, Vec<Ipv4Addr>> {
    let server: Ipv4Addr = SERVER_IPS[0].parse().expect("ip");
    let second: Ipv4Addr = SERVER_IPS[1].parse().expect("ip");
    let echo: Ipv4Addr = ECHO_IP.parse().expect("ip");
    HashMap::from([
        ("allowed.example.test", vec![server]),
        ("other.example.test", vec![server]),
        ("denied.example.test", vec![server]),
        ("wild.example.test", vec![server]),
        ("sub.wild.example.test", vec![server]),
        ("deep.sub.wild.example.test", vec![server]),
        // Denied addresses first: the proxy must skip them and dial only
        // the one that passes.
        (
            "mixed.example.test",
            vec![
                Ipv4Addr::LOCALHOST,
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(169, 254, 169, 254),
                second,
            ],
        ),
        ("private.example.test", vec![Ipv4Addr::new(10, 1, 2, 3)]),
        ("api.example.test", vec![echo]),
        ("second.example.test", vec![echo]),
    ])
}

/// Names the TLS certificate covers.
const TLS_NAMES: [&str; 3] = [
    "allowed.example.test",
    "sub.wild.example.test",
    "denied.example.test",
];

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// One accepted connection: who dialled, and which server address.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// The namespaces and servers; removed on drop.
pub struct Upstream {
    pub upstream_ns: String,
    server_ns: String,
    accepted: Arc<Mutex<Vec<Accepted>>>,
    /// PEM of the CA that signed the HTTPS server's certificate.
    pub ca_pem: String,
}

impl Upstream {
    pub fn start() -> Upstream {
        let tag = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut up = Upstream {
            upstream_ns: format!("sbt-up-{tag}"),
            server_ns: format!("sbt-srv-{tag}"),
            accepted: Arc::default(),
            ca_pem: String::new(),
        };
        let (up_if, srv_if) = (format!("sbu{tag}"), format!("sbs{tag}"));
        ip(&["netns", "add", &up.upstream_ns]);
        ip(&["netns", "add", &up.server_ns]);
        ip(&[
            "-n",
            &up.upstream_ns,
            "link",
            "add",
            &up_if,
            "type",
            "veth",
            "peer",
            "name",
            &srv_if,
            "netns",
            &up.server_ns,
        ]);
        let prefixed = |addr: &str| format!("{addr}/24");
        ip(&[
            "-n",
            &up.upstream_ns,
            "addr",
            "add",
            &prefixed(UPSTREAM_IP),
            "dev",
            &up_if,
        ]);
        for addr in SERVER_IPS.iter().chain([&DNS_IP, &ECHO_IP]) {
            ip(&[
                "-n",
                &up.server_ns,
                "addr",
                "add",
                &prefixed(addr),
                "dev",
                &srv_if,
            ]);
        }
        for (ns, dev) in [(&up.upstream_ns, &up_if), (&up.server_ns, &srv_if)] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let (tls, ca_pem) = test_tls("sandboxd egress test CA", &TLS_NAMES, &[]);
        let server_ns = PathBuf::from(format!("/run/netns/{}", up.server_ns));
        // Each server address on its own (not 0.0.0.0), so a test can add
        // servers of its own on the other addresses.
        let (listeners, dns) = in_netns(&server_ns, || {
            let listeners: Vec<_> = SERVER_IPS
                .iter()
                .flat_map(|ip| [(*ip, 80), (*ip, 443)])
                .map(|(ip, port)| (port, TcpListener::bind((ip, port))))
                .collect();
            (listeners, UdpSocket::bind((DNS_IP, 53)))
        })
        .expect("enter the server namespace");
        for (port, listener) in listeners {
            let listener = listener.unwrap_or_else(|e| panic!("bind :{port}: {e}"));
            let accepted = Arc::clone(&up.accepted);
            let tls = (port == 443).then(|| Arc::clone(&tls));
            std::thread::spawn(move || accept_loop(listener, accepted, tls));
        }
        let dns = dns.expect("bind :53");
        std::thread::spawn(move || serve_dns(dns));
        up.ca_pem = ca_pem;
        up
    }

    /// Flags that point a daemon at this upstream.
    pub fn daemon_flags(&self) -> Vec<String> {
        vec![
            "--upstream-netns".into(),
            self.upstream_ns.clone(),
            "--upstream-dns".into(),
            format!("{DNS_IP}:53"),
        ]
    }

    /// The servers' namespace, for servers a test adds there.
    pub fn server_netns(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.server_ns))
    }

    /// Connections accepted so far, oldest first.
    pub fn accepted(&self) -> Vec<Accepted> {
        self.accepted.lock().expect("accepted").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Removing a namespace removes its end of the veth, and so the pair.
        for ns in [&self.upstream_ns, &self.server_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A test CA named `ca_name` (PEM, returned) and a server configuration
/// with a certificate it signed for `names`, offering `alpn`.
pub fn test_tls(
    ca_name: &str,
    names: &[&str],
    alpn: &[&[u8]],
) -> (Arc<rustls::ServerConfig>, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key).expect("CA cert");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names)
        .expect("leaf params")
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("leaf cert");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .expect("server config");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    (Arc::new(config), ca.pem())
}

fn accept_loop(
    listener: TcpListener,
    accepted: Arc<Mutex<Vec<Accepted>>>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { return };
        if let (Ok(peer), Ok(local)) = (conn.peer_addr(), conn.local_addr()) {
            accepted
                .lock()
                .expect("accepted")
                .push(Accepted { peer, local });
        }
        let tls = tls.clone();
        std::thread::spawn(move || match tls {
            Some(config) => {
                let Ok(session) = rustls::ServerConnection::new(config) else {
                    return;
                };
                serve_http(rustls::StreamOwned::new(session, conn));
            }
            None => serve_http(conn),
        });
    }
}

/// Answers every request on a kept-alive connection: `/big` with
/// [`BIG_LEN`] bytes, `/bytes/N` with N bytes, anything else with [`BODY`].
fn serve_http(mut conn: impl Read + Write) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let body_len = requested_len(&buf[..end]);
            buf.drain(..end + 4);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                body_len.unwrap_or(BODY.len())
            );
            let sent = conn
                .write_all(head.as_bytes())
                .and_then(|()| match body_len {
                    Some(len) => {
                        let block = vec![b'x'; 256 * 1024];
                        let mut left = len;
                        while left > 0 {
                            let n = left.min(block.len());
                            conn.write_all(&block[..n])?;
                            left -= n;
                        }
                        Ok(())
                    }
                    None => conn.write_all(BODY.as_bytes()),
                });
            if sent.and_then(|()| conn.flush()).is_err() {
                return;
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The body length a request head asks for (`/big`, `/bytes/N`), if any.
fn requested_len(head: &[u8]) -> Option<usize> {
    let line = head.split(|b| *b == b'\r').next()?;
    let path = std::str::from_utf8(line).ok()?.split(' ').nth(1)?;
    if path == "/big" {
        return Some(BIG_LEN);
    }
    path.strip_prefix("/bytes/")?.parse().ok()
}

/// A UDP DNS server for [`zone`].
fn serve_dns(sock: UdpSocket) {
    let zone = zone();
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            return;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut reply = Message::new();
        reply.set_header(Header::response_from_request(query.header()));
        for q in query.queries() {
            reply.add_query(q.clone());
            let name = q
                .name()
                .to_ascii()
                .trim_end_matches('.')
                .to_ascii_lowercase();
            match zone.get(name.as_str()) {
                Some(addrs) if q.query_type() == RecordType::A => {
                    for addr in addrs {
                        reply.add_answer(Record::from_rdata(
                            q.name().clone(),
                            60,
                            RData::A(A(*addr)),
                        ));
                    }
                }
                Some(_) => {}
                None => {
                    reply.set_response_code(ResponseCode::NXDomain);
                }
            }
        }
        if let Ok(bytes) = reply.to_vec() {
            let _ = sock.send_to(&bytes, from);
        }
    }
}
