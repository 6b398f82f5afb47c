//! What brokering a secret costs per request: the same HTTPS server (the
//! tests' echo upstream, one certificate for both names) reached from one
//! sandbox as `api.example.test`, a bound host the proxy intercepts (TLS
//! terminated, headers rewritten, TLS again upstream), and as
//! `second.example.test`, an allowed host the proxy tunnels opaquely. The
//! same Python client measures both in one run:
//!
//! * kept-alive: one small request after another on one connection;
//! * new connection: TCP + TLS handshake + one small request, each time
//!   (the bound host's leaf is cached in the supervisor);
//! * throughput: one 100 MB response, three times.
//!
//!     sudo cargo bench --bench secrets      # BENCH_RUNS=300 requests by default
//!
//! Prints medians and writes the raw samples to `benches/results/secrets.json`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/echo.rs"]
mod echo;
mod peers;
#[path = "../tests/common/upstream.rs"]
mod upstream;

use common::Daemon;
use hyper::Method;
use peers::{median, HttpSamples};
use serde_json::json;
use upstream::Upstream;

const CLIENT: &str = r#"
import http.client, json, os, socket, ssl, sys, time
host, n, size, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.create_default_context()
ctx.load_verify_locations('/tmp/echo-ca.pem')
ip = socket.gethostbyname(host)
class Connection(http.client.HTTPSConnection):
    # Resolved once: a name lookup per connection is not what is measured.
    def connect(self):
        raw = socket.create_connection((ip, 443), timeout=self.timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
headers = {'Authorization': 'Bearer ' + os.environ['BENCH_KEY']}
def get(c, path):
    c.request('GET', path, headers=headers)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, r.status
    return body
c = Connection(host, context=ctx, timeout=30)
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
    c = Connection(host, context=ctx, timeout=30)
    get(c, '/new')
    fresh.append((time.perf_counter() - begun) * 1000)
    c.close()
rates = []
for _ in range(reps):
    c = Connection(host, context=ctx, timeout=60)
    begun = time.perf_counter()
    c.request('GET', '/bytes/%d' % size, headers=headers)
    r = c.getresponse()
    got = 0
    while True:
        chunk = r.read(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    assert got == size, got
    rates.append(size / (time.perf_counter() - begun) / 1e6)
    c.close()
print(json.dumps({'kept_ms': kept, 'new_ms': fresh, 'mb_per_s': rates}))
"#;

const SIZE: usize = 100_000_000;
const REPS: usize = 3;

async fn measure(daemon: &Daemon, id: &str, host: &str, n: usize) -> HttpSamples {
    let run = daemon
        .exec(
            id,
            &[
                "python3",
                "/tmp/client.py",
                host,
                &n.to_string(),
                &SIZE.to_string(),
                &REPS.to_string(),
            ],
        )
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}{}", run.out(), run.err());
    HttpSamples::parse(&run.out())
}

async fn run(upstream: &Upstream, echo: &echo::Echo, n: usize) -> (HttpSamples, HttpSamples) {
    let mut flags = upstream.daemon_flags();
    flags.extend([
        "--egress-bandwidth-mbit".to_string(),
        "0".to_string(),
        "--egress-extra-ca".to_string(),
        echo.ca_path.display().to_string(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&flags);
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/secrets",
            Some(
                json!({"name": "BENCH_KEY", "value": "bench-value", "hosts": ["api.example.test"]}),
            ),
        )
        .await;
    assert_eq!(status.as_u16(), 201, "{v}");
    let id = daemon
        .create(json!({
            "image": "python", "cpu": 1,
            "allow_list": ["second.example.test"], "secrets": ["BENCH_KEY"],
        }))
        .await;
    for (path, body) in [
        ("/tmp/client.py", CLIENT.as_bytes().to_vec()),
        ("/tmp/echo-ca.pem", echo.ca_pem.clone().into_bytes()),
    ] {
        let (status, _) = daemon
            .raw(
                Method::PUT,
                &format!("/v1/sandboxes/{id}/files?path={path}"),
                body,
            )
            .await;
        assert!(status.is_success(), "upload {path}: {status}");
    }
    let tunnel = measure(&daemon, &id, "second.example.test", n).await;
    let intercepted = measure(&daemon, &id, "api.example.test", n).await;
    // What was measured is what it says: the bound host got the value, the
    // other the placeholder.
    let kept = echo.seen_at("/kept");
    let carried = |host: &str, bearer: &dyn Fn(&str) -> bool| {
        kept.iter()
            .filter(|s| s.host.starts_with(host))
            .all(|s| s.authorization.as_deref().is_some_and(bearer))
    };
    assert!(carried("api.example.test", &|a| a == "Bearer bench-value"));
    assert!(carried("second.example.test", &|a| a
        .contains("sandboxd-placeholder-")));
    assert_eq!(kept.len(), 2 * n, "every request reached the server");
    daemon.delete(&id).await;
    (tunnel, intercepted)
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("secrets benchmark skipped: {why}");
        return;
    }
    let n = peers::bench_runs(300);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = Upstream::start();
    let echo = echo::Echo::start(&upstream);
    let (tunnel, intercepted) = runtime.block_on(run(&upstream, &echo, n));
    let (tk, ik) = (median(&tunnel.kept_ms), median(&intercepted.kept_ms));
    let (tn, inew) = (median(&tunnel.new_ms), median(&intercepted.new_ms));
    let (tr, ir) = (median(&tunnel.mb_per_s), median(&intercepted.mb_per_s));
    println!(
        "HTTPS through the secrets interception vs the opaque tunnel ({n} requests, {REPS} x {} MB)",
        SIZE / 1_000_000
    );
    println!(
        "  kept-alive request   tunnel {tk:.3} ms   intercepted {ik:.3} ms   added {:.3} ms",
        ik - tk
    );
    println!(
        "  new connection       tunnel {tn:.3} ms   intercepted {inew:.3} ms   added {:.3} ms",
        inew - tn
    );
    println!(
        "  throughput           tunnel {tr:.0} MB/s   intercepted {ir:.0} MB/s   ratio {:.2}",
        ir / tr
    );
    let raw = json!({
        "requests": n,
        "bytes_per_transfer": SIZE,
        "tunnel": tunnel.to_json(),
        "intercepted": intercepted.to_json(),
        "medians": {
            "tunnel_kept_ms": tk, "intercepted_kept_ms": ik, "added_kept_ms": ik - tk,
            "tunnel_new_ms": tn, "intercepted_new_ms": inew, "added_new_ms": inew - tn,
            "tunnel_mb_per_s": tr, "intercepted_mb_per_s": ir, "throughput_ratio": ir / tr,
        },
    });
    peers::write_results("secrets", &raw);
}
