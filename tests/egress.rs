//! Root-only: egress policy seen from inside container sandboxes. The
//! upstream is a plain HTTP test server in a test network namespace on a
//! documentation address (203.0.113.10), joined to the host namespace (where
//! the supervisors dial from) by a veth pair; test names resolve to it
//! through the daemon's test-only `test_hosts`. Nothing leaves the machine.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
use hyper::{Method, StatusCode};
use sandboxd::net::plumbing::in_netns;
use serde_json::{json, Value};

const UPSTREAM_IP: &str = "203.0.113.10";
const BODY: &str = "hello from upstream";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test namespace with the upstream HTTP server; removed on drop.
struct Upstream {
    ns: String,
    host_if: String,
    /// Peer addresses of the connections the server accepted.
    peers: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Upstream {
    fn start() -> Upstream {
        let ns = format!("sbt-up-{}", std::process::id());
        let host_if = format!("sbta{}", std::process::id() % 100_000);
        let peer_if = format!("sbtb{}", std::process::id() % 100_000);
        ip(&["netns", "add", &ns]);
        let up = Upstream {
            ns: ns.clone(),
            host_if: host_if.clone(),
            peers: Arc::default(),
        };
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &ns,
        ]);
        ip(&["addr", "add", "203.0.113.1/24", "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        let addr = format!("{UPSTREAM_IP}/24");
        ip(&["-n", &ns, "addr", "add", &addr, "dev", &peer_if]);
        ip(&["-n", &ns, "link", "set", &peer_if, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        let path = PathBuf::from(format!("/run/netns/{ns}"));
        let listener = in_netns(&path, || TcpListener::bind((UPSTREAM_IP, 80)))
            .expect("enter upstream ns")
            .expect("bind upstream");
        let peers = Arc::clone(&up.peers);
        std::thread::spawn(move || serve(listener, peers));
        up
    }

    fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Answers every request (keep-alive) with [`BODY`].
fn serve(listener: TcpListener, peers: Arc<Mutex<Vec<SocketAddr>>>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { return };
        if let Ok(peer) = conn.peer_addr() {
            peers.lock().expect("peers").push(peer);
        }
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{BODY}",
                        BODY.len()
                    );
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
    }
}

fn daemon() -> Daemon {
    Daemon::start_with(&[
        "--test-hosts",
        "allowed.example.test=203.0.113.10,sub.wild.example.test=203.0.113.10,wild.example.test=203.0.113.10",
    ])
}

/// Fetches `url` with busybox wget; returns (success, output, seconds taken).
async fn fetch(daemon: &Daemon, id: &str, url: &str) -> (bool, String, f64) {
    let begun = Instant::now();
    let run = daemon
        .sh(id, &format!("timeout 10 wget -O - {url} 2>&1; echo rc=$?"))
        .await;
    (
        run.out().trim_end().ends_with("rc=0"),
        format!("{}{}", run.out(), run.err()),
        begun.elapsed().as_secs_f64(),
    )
}

async fn assert_fetch_ok(daemon: &Daemon, id: &str, url: &str) {
    let (ok, out, _) = fetch(daemon, id, url).await;
    if !(ok && out.contains(BODY)) {
        let log = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cat {}/*/{id}/shim.log",
                daemon.run_dir().display()
            ))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let dbg = daemon
            .sh(id, &format!("cat /etc/resolv.conf; nslookup allowed.example.test 2>&1; wget -O - {url} 2>&1; echo rc=$?"))
            .await;
        panic!(
            "{url}: {out}\nsupervisor log:\n{log}\n{}{}",
            dbg.out(),
            dbg.err()
        );
    }
}

async fn assert_refused_fast(daemon: &Daemon, id: &str, url: &str) {
    let (ok, out, secs) = fetch(daemon, id, url).await;
    assert!(!ok, "{url} should be refused: {out}");
    assert!(!out.contains(BODY), "{url}: {out}");
    assert!(secs < 3.0, "{url} took {secs:.1}s to fail: {out}");
}

async fn network_view(daemon: &Daemon, id: &str) -> Value {
    let (status, v) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["network"].clone()
}

#[tokio::test]
async fn egress_follows_the_policy() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon();

    // Create-time validation names the entry.
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "busybox", "allow_list": ["ok.example.test", "bad..name"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("bad..name"), "{v}");

    // Default: block, DNS included.
    let blocked = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(network_view(&daemon, &blocked).await["mode"], "block");
    let begun = Instant::now();
    let run = daemon
        .exec(&blocked, &["nslookup", "allowed.example.test"])
        .await;
    assert_ne!(run.exit_code(), Some(0), "{}", run.out());
    assert!(
        begun.elapsed() < Duration::from_secs(3),
        "DNS refusal took {:?}: {}{}",
        begun.elapsed(),
        run.out(),
        run.err()
    );
    assert_refused_fast(&daemon, &blocked, &format!("http://{UPSTREAM_IP}/")).await;

    // An allow list: the listed host works, others fail fast, wildcards
    // cover subdomains only.
    let id = daemon
        .create(json!({
            "image": "busybox",
            "allow_list": ["allowed.example.test", "*.wild.example.test"]
        }))
        .await;
    let view = network_view(&daemon, &id).await;
    assert_eq!(view["mode"], "allow_list", "{view}");
    let before = upstream.peers().len();
    assert_fetch_ok(&daemon, &id, "http://allowed.example.test/").await;
    let peers = upstream.peers();
    assert_eq!(peers.len(), before + 1, "{peers:?}");
    // The proxy dialled from the host namespace's address on the test link.
    assert_eq!(peers[before].ip().to_string(), "203.0.113.1");
    assert_fetch_ok(&daemon, &id, "http://sub.wild.example.test/").await;
    assert_refused_fast(&daemon, &id, "http://wild.example.test/").await;
    assert_refused_fast(&daemon, &id, "http://denied.example.test/").await;
    // No IP entry: a literal address is refused.
    assert_refused_fast(&daemon, &id, &format!("http://{UPSTREAM_IP}/")).await;
    // Straight to the proxy's port: not redirected, refused.
    assert_refused_fast(&daemon, &id, "http://10.200.0.2:15001/").await;
    assert_refused_fast(&daemon, &id, "http://127.0.0.1:15001/").await;

    // A second request on a kept-alive connection naming another host.
    let script = "printf 'GET / HTTP/1.1\\r\\nHost: allowed.example.test\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: other.example.test\\r\\n\\r\\n' | nc -w 3 203.0.113.10 80";
    let run = daemon.sh(&id, script).await;
    assert!(
        run.out().matches(BODY).count() <= 1,
        "the second request went through: {}",
        run.out()
    );

    // A policy change applies to the next connection.
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(json!({"block_network": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["network"]["mode"], "block", "{v}");
    assert_refused_fast(&daemon, &id, "http://allowed.example.test/").await;
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(json!({"allow_list": [UPSTREAM_IP, "10.0.0.0/8", "169.254.169.254"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // IP entries match the original destination.
    assert_fetch_ok(&daemon, &id, &format!("http://{UPSTREAM_IP}/")).await;
    // Listed private and metadata addresses stay refused.
    assert_refused_fast(&daemon, &id, "http://10.1.2.3/").await;
    assert_refused_fast(&daemon, &id, "http://169.254.169.254/").await;
    // A bad PATCH is a 400 and changes nothing.
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(json!({"block_network": true, "allow_list": ["x.test"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_fetch_ok(&daemon, &id, &format!("http://{UPSTREAM_IP}/")).await;

    // Every connection is in the sandbox's egress log, with its verdict.
    let (status, log) = daemon
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/network/log"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let entries = log["entries"].as_array().expect("entries");
    assert!(
        entries.iter().any(|e| e["verdict"] == "allowed"
            && e["host"] == UPSTREAM_IP
            && e["bytes"].as_u64() > Some(0)),
        "{log}"
    );
    assert!(
        entries.iter().any(|e| e["verdict"] == "refused"
            && e["host"] == "169.254.169.254"
            && e["reason"].is_string()),
        "{log}"
    );

    // The proxy's work shows in the sandbox's usage and the daemon's metrics.
    let (_, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert!(
        sandbox["usage"]["egress_bytes"].as_u64() > Some(0),
        "{sandbox}"
    );
    let (_, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    let metrics = String::from_utf8_lossy(&metrics);
    for verdict in ["allowed", "refused"] {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "sandboxd_egress_connections_total{{verdict=\"{verdict}\"}}"
                ))
            })
            .unwrap_or_else(|| panic!("no {verdict} counter in\n{metrics}"));
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(value > 0.0, "{line}");
    }

    daemon.delete(&id).await;
    daemon.delete(&blocked).await;
    drop(upstream);
}
