//! What a preview URL costs per request: the same HTTP/1.1 server (Python,
//! in a sandbox, on 127.0.0.1:8000) reached by the same Python client
//! through the ingress (`/<id>/8000/...` on loopback, with the port's
//! token) and directly, from inside the sandbox's network namespace (the
//! client `nsenter`s it), in one run:
//!
//! * kept-alive: one small request after another on one connection;
//! * new connection: TCP connect + one small request, each time;
//! * throughput: one 1 GB download, three times; also through a raw TCP
//!   exposure of a second instance of the server (a byte relay with no
//!   HTTP in it: the best a proxy hop does on this host).
//!
//!     sudo cargo bench --bench ingress      # BENCH_RUNS=300 requests by default
//!
//! Prints medians and writes the raw samples to `benches/results/ingress.json`.

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use common::Daemon;
use peers::{median, HttpSamples};
use serde_json::json;

/// The app: keep-alive HTTP/1.1, a small answer, and `/bytes/N` streamed
/// from one preallocated buffer so the server is not what is measured.
const SERVER: &str = r#"
import http.server, socketserver
CHUNK = b'x' * (1 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    # Headers and body are two writes: without TCP_NODELAY the second
    # waits for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith('/bytes/'):
            n = int(self.path.split('/')[2])
            self.send_response(200)
            self.send_header('Content-Length', str(n))
            self.end_headers()
            while n > 0:
                piece = CHUNK if n >= len(CHUNK) else CHUNK[:n]
                self.wfile.write(piece)
                n -= len(piece)
            return
        body = b'ok'
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
import sys
S(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"#;

const CLIENT: &str = r#"
import http.client, json, socket, sys, time
port, prefix, token, n, size, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
prefix = '' if prefix == '-' else prefix
headers = {'X-Sandbox-Token': token} if token != '-' else {}
class Connection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.create_connection(('127.0.0.1', int(port)), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def get(c, path):
    c.request('GET', prefix + path, headers=headers)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, (r.status, body[:200])
    return body
c = Connection('127.0.0.1', timeout=30)
for _ in range(20):
    get(c, '/warm')
kept = []
for _ in range(n):
    begun = time.perf_counter()
    get(c, '/kept')
    kept.append((time.perf_counter() - begun) * 1000)
c.close()
fresh = []
for _ in range(n):
    begun = time.perf_counter()
    c = Connection('127.0.0.1', timeout=30)
    get(c, '/new')
    fresh.append((time.perf_counter() - begun) * 1000)
    c.close()
rates = []
buf = bytearray(1 << 20)
for _ in range(reps):
    c = Connection('127.0.0.1', timeout=60)
    begun = time.perf_counter()
    c.request('GET', prefix + '/bytes/%d' % size, headers=headers)
    r = c.getresponse()
    got = 0
    while True:
        k = r.readinto(buf)
        if not k:
            break
        got += k
    assert got == size, got
    rates.append(size / (time.perf_counter() - begun) / 1e6)
    c.close()
print(json.dumps({'kept_ms': kept, 'new_ms': fresh, 'mb_per_s': rates}))
"#;

const SIZE: usize = 1_000_000_000;
const REPS: usize = 3;

/// Runs the client on the host, in `netns` when given.
fn client(
    netns: Option<&std::path::Path>,
    port: u16,
    prefix: &str,
    token: &str,
    n: usize,
) -> HttpSamples {
    let script =
        std::env::temp_dir().join(format!("sandboxd-ingress-bench-{}.py", std::process::id()));
    std::fs::write(&script, CLIENT).expect("client script");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net={}", ns.display())).arg("python3");
            c
        }
        None => std::process::Command::new("python3"),
    };
    let out = cmd
        .arg(&script)
        .args([
            &port.to_string(),
            prefix,
            token,
            &n.to_string(),
            &SIZE.to_string(),
            &REPS.to_string(),
        ])
        .output()
        .expect("python3 client");
    let _ = std::fs::remove_file(&script);
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    HttpSamples::parse(&String::from_utf8_lossy(&out.stdout))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

async fn run(n: usize) -> (HttpSamples, HttpSamples, HttpSamples) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let tcp_port = free_port();
    let tcp_range = format!("{tcp_port}-{tcp_port}");
    let daemon = Daemon::start_with(&[
        "--ingress-listen",
        &listen,
        "--ingress-tcp-ports",
        &tcp_range,
    ]);
    let created = daemon
        .call(
            hyper::Method::POST,
            "/v1/sandboxes",
            Some(json!({"image": "python", "cpu": 1, "ports": [8000]})),
        )
        .await
        .1;
    let id = created["id"].as_str().expect("sandbox id").to_string();
    let token = created["ports"][0]["token"]
        .as_str()
        .expect("the port's token")
        .to_string();
    let (status, _) = daemon
        .raw(
            hyper::Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/server.py"),
            SERVER.as_bytes().to_vec(),
        )
        .await;
    assert!(status.is_success(), "upload: {status}");
    for app_port in ["8000", "8001"] {
        daemon
            .start_process(
                &id,
                json!({"argv": ["python3", "/tmp/server.py", app_port]}),
            )
            .await;
    }
    let (status, relay) = daemon
        .call(
            hyper::Method::POST,
            &format!("/v1/sandboxes/{id}/ports"),
            Some(json!({"port": 8001, "protocol": "tcp", "auth": "none"})),
        )
        .await;
    assert_eq!(status.as_u16(), 201, "{relay}");
    assert_eq!(relay["address"], format!("127.0.0.1:{tcp_port}"), "{relay}");
    // Ready once the ingress gets an answer from the app (502 before).
    let prefix = format!("/{id}/8000");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let answered = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("X-Sandbox-Token: {token}"))
            .arg(format!("http://{listen}{prefix}/"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        if answered == "200" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the app never answered: {answered}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let netns = daemon.run_dir().join("sandboxes").join(&id).join("netns");
    let direct = client(Some(&netns), 8000, "-", "-", n);
    let through = client(None, port, &prefix, &token, n);
    let relayed = client(None, tcp_port, "-", "-", n);
    daemon.delete(&id).await;
    (direct, through, relayed)
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("ingress benchmark skipped: {why}");
        return;
    }
    let n = peers::bench_runs(300);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (direct, through, relayed) = runtime.block_on(run(n));
    let (dk, ik) = (median(&direct.kept_ms), median(&through.kept_ms));
    let (dn, inew) = (median(&direct.new_ms), median(&through.new_ms));
    let (dr, ir) = (median(&direct.mb_per_s), median(&through.mb_per_s));
    let tr = median(&relayed.mb_per_s);
    // Raw TCP is not pooled: each new connection is dialled through the
    // supervisor (unix connect, Dial, connect in the namespace, SCM_RIGHTS).
    let tn = median(&relayed.new_ms);
    println!(
        "HTTP through the ingress vs directly in the sandbox's namespace ({n} requests, {REPS} x {} MB)",
        SIZE / 1_000_000
    );
    println!(
        "  kept-alive request   direct {dk:.3} ms   ingress {ik:.3} ms   added {:.3} ms",
        ik - dk
    );
    println!(
        "  new connection       direct {dn:.3} ms   ingress {inew:.3} ms   added {:.3} ms",
        inew - dn
    );
    println!(
        "  throughput           direct {dr:.0} MB/s   ingress {ir:.0} MB/s   ratio {:.2}",
        ir / dr
    );
    println!(
        "  raw TCP exposure     relay {tr:.0} MB/s   ratio {:.2} (a byte relay, no HTTP: the ceiling of one proxy hop here)",
        tr / dr
    );
    println!(
        "  new raw TCP conn.    relay {tn:.3} ms   added {:.3} ms (a dial through the supervisor each time; HTTP pools its dials)",
        tn - dn
    );
    let raw = json!({
        "requests": n,
        "bytes_per_transfer": SIZE,
        "direct": direct.to_json(),
        "ingress": through.to_json(),
        "raw_tcp_relay": relayed.to_json(),
        "medians": {
            "direct_kept_ms": dk, "ingress_kept_ms": ik, "added_kept_ms": ik - dk,
            "direct_new_ms": dn, "ingress_new_ms": inew, "added_new_ms": inew - dn,
            "direct_mb_per_s": dr, "ingress_mb_per_s": ir, "throughput_ratio": ir / dr,
            "raw_tcp_relay_mb_per_s": tr, "raw_tcp_relay_ratio": tr / dr,
            "raw_tcp_relay_new_ms": tn, "added_dial_ms": tn - dn,
        },
    });
    peers::write_results("ingress", &raw);
}
