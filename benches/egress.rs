//! Throughput and connection set-up through a sandbox's egress proxy, beside
//! a direct connection from the upstream namespace to the same server, in
//! one run. The same Python client does both: inside a sandbox (through the
//! nftables redirect and the proxy, which dials from `upstream_netns`), and
//! run directly in that upstream namespace. Prints medians and ratios and
//! writes the raw samples to `benches/results/egress.json`.
//!
//!     sudo cargo bench --bench egress      # BENCH_RUNS=200 connections by default
//!
//! Set-up is connect + one small request + its answer, per new connection.
//! Throughput is one 200 MB response, five times. The proxy runs with the
//! bandwidth cap off (what the proxy itself can do) and with the shipped
//! default (1000 Mbit/s per direction).

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;
#[path = "../tests/common/upstream.rs"]
mod upstream;

use std::process::Command;

use common::Daemon;
use hyper::Method;
use peers::median;
use serde_json::{json, Value};
use upstream::{Upstream, SERVER_IPS};

const CLIENT: &str = r#"
import json, socket, sys, time
host, conns, size, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ip = socket.gethostbyname(host)
def request(path):
    return b'GET ' + path + b' HTTP/1.1\r\nHost: allowed.example.test\r\n\r\n'
def read_response(s, buf):
    got, head, want = 0, b'', None
    while want is None or got < want:
        n = s.recv_into(buf)
        if not n:
            raise SystemExit('closed early')
        if want is None:
            head += bytes(buf[:n])
            end = head.find(b'\r\n\r\n')
            if end >= 0:
                length = int(head.split(b'Content-Length: ')[1].split(b'\r\n')[0])
                want = end + 4 + length
                got = len(head)
        else:
            got += n
buf = bytearray(1 << 20)
setup = []
for _ in range(conns):
    begun = time.perf_counter()
    s = socket.create_connection((ip, 80))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(request(b'/'))
    read_response(s, buf)
    setup.append((time.perf_counter() - begun) * 1000)
    s.close()
rates = []
for _ in range(reps):
    s = socket.create_connection((ip, 80))
    begun = time.perf_counter()
    s.sendall(request(b'/bytes/%d' % size))
    read_response(s, buf)
    rates.append(size / (time.perf_counter() - begun) / 1e6)
    s.close()
print(json.dumps({'setup_ms': setup, 'mb_per_s': rates}))
"#;

const SIZE: usize = 200_000_000;
const REPS: usize = 5;

fn parse(out: &str) -> (Vec<f64>, Vec<f64>) {
    let v: Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("client output {out:?}: {e}"));
    let list = |key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    (list("setup_ms"), list("mb_per_s"))
}

/// Runs the client in a sandbox of a daemon started with `extra` flags.
async fn through_proxy(upstream: &Upstream, extra: &[&str], conns: usize) -> (Vec<f64>, Vec<f64>) {
    let mut flags = upstream.daemon_flags();
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&flags);
    let id = daemon
        .create(json!({"image": "python", "cpu": 1, "allow_list": ["allowed.example.test"]}))
        .await;
    let (status, _) = daemon
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/client.py"),
            CLIENT.as_bytes().to_vec(),
        )
        .await;
    assert!(status.is_success(), "upload: {status}");
    let run = daemon
        .exec(
            &id,
            &[
                "python3",
                "/tmp/client.py",
                "allowed.example.test",
                &conns.to_string(),
                &SIZE.to_string(),
                &REPS.to_string(),
            ],
        )
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}{}", run.out(), run.err());
    daemon.delete(&id).await;
    parse(&run.out())
}

/// Runs the client straight from the upstream namespace to the server.
fn direct(upstream: &Upstream, conns: usize) -> (Vec<f64>, Vec<f64>) {
    let script =
        std::env::temp_dir().join(format!("sandboxd-egress-bench-{}.py", std::process::id()));
    std::fs::write(&script, CLIENT).expect("write client");
    let out = Command::new("ip")
        .args(["netns", "exec", &upstream.upstream_ns, "python3"])
        .arg(&script)
        .args([
            SERVER_IPS[0],
            &conns.to_string(),
            &SIZE.to_string(),
            &REPS.to_string(),
        ])
        .output()
        .expect("run the direct client");
    let _ = std::fs::remove_file(&script);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8_lossy(&out.stdout))
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("egress benchmark skipped: {why}");
        return;
    }
    let conns = peers::bench_runs(200);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = Upstream::start();
    let (direct_setup, direct_rate) = direct(&upstream, conns);
    let (proxy_setup, proxy_rate) = runtime.block_on(through_proxy(
        &upstream,
        &["--egress-bandwidth-mbit", "0"],
        conns,
    ));
    let (_, capped_rate) = runtime.block_on(through_proxy(&upstream, &[], conns.min(20)));

    let (ds, ps) = (median(&direct_setup), median(&proxy_setup));
    let (dr, pr, cr) = (
        median(&direct_rate),
        median(&proxy_rate),
        median(&capped_rate),
    );
    println!(
        "egress through the proxy vs direct ({conns} connections, {REPS} x {} MB)",
        SIZE / 1_000_000
    );
    println!(
        "  set-up median   direct {ds:.3} ms   proxy {ps:.3} ms   added {:.3} ms",
        ps - ds
    );
    println!(
        "  throughput      direct {dr:.0} MB/s   proxy {pr:.0} MB/s   ratio {:.2}",
        pr / dr
    );
    println!("  throughput with the default 1000 Mbit/s cap: {cr:.0} MB/s");

    let raw = json!({
        "connections": conns,
        "bytes_per_transfer": SIZE,
        "direct": {"setup_ms": direct_setup, "mb_per_s": direct_rate},
        "proxy_uncapped": {"setup_ms": proxy_setup, "mb_per_s": proxy_rate},
        "proxy_default_cap": {"mb_per_s": capped_rate},
        "medians": {
            "direct_setup_ms": ds, "proxy_setup_ms": ps, "added_setup_ms": ps - ds,
            "direct_mb_per_s": dr, "proxy_mb_per_s": pr, "throughput_ratio": pr / dr,
            "proxy_default_cap_mb_per_s": cr,
        },
    });
    peers::write_results("egress", &raw);
}
