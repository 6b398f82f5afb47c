//! Root-only: egress policy seen from inside container sandboxes, against
//! test servers reached through the daemon's `upstream_netns` (see
//! `common/upstream.rs`). Nothing leaves the machine.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::net::{IpAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use upstream::{Upstream, BIG_LEN, BODY, SERVER_IPS, UPSTREAM_IP};

fn daemon(upstream: &Upstream, extra: &[&str]) -> Daemon {
    let mut flags = upstream.daemon_flags();
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Daemon::start_with(&flags)
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
        panic!("{url}: {out}\nsupervisor log:\n{log}");
    }
}

async fn assert_refused_fast(daemon: &Daemon, id: &str, url: &str) {
    let (ok, out, secs) = fetch(daemon, id, url).await;
    assert!(!ok, "{url} should be refused: {out}");
    assert!(!out.contains(BODY), "{url}: {out}");
    assert!(secs < 3.0, "{url} took {secs:.1}s to fail: {out}");
}

/// Runs `curl -sS --max-time 10 [extra...] url` in sandbox `id`.
async fn curl(daemon: &Daemon, id: &str, extra: &[&str], url: &str) -> common::Exec {
    let mut argv = vec!["curl", "-sS", "--max-time", "10"];
    argv.extend_from_slice(extra);
    argv.push(url);
    daemon.exec(id, &argv).await
}

async fn network_view(daemon: &Daemon, id: &str) -> Value {
    let (status, v) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["network"].clone()
}

async fn set_policy(daemon: &Daemon, id: &str, body: Value) -> Value {
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// `sandboxd_<name><labels>`, once above zero.
async fn await_metric(daemon: &Daemon, name: &str, labels: &str) -> f64 {
    daemon
        .await_metric(&format!("sandboxd_{name}{labels} "))
        .await
}

#[tokio::test]
async fn egress_follows_the_policy() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &[]);

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
    assert_refused_fast(&daemon, &blocked, &format!("http://{}/", SERVER_IPS[0])).await;

    // An allow list: the listed host works, others fail fast, wildcards
    // cover subdomains at any depth but not the apex.
    let id = daemon
        .create(json!({
            "image": "busybox",
            "allow_list": [
                "allowed.example.test", "*.wild.example.test",
                "mixed.example.test", "private.example.test"
            ]
        }))
        .await;
    let view = network_view(&daemon, &id).await;
    assert_eq!(view["mode"], "allow_list", "{view}");
    let before = upstream.accepted().len();
    assert_fetch_ok(&daemon, &id, "http://allowed.example.test/").await;
    let accepted = upstream.accepted();
    assert_eq!(accepted.len(), before + 1, "{accepted:?}");
    // Dialled from the upstream namespace, to the address the name has.
    assert_eq!(accepted[before].peer.ip().to_string(), UPSTREAM_IP);
    assert_eq!(
        accepted[before].local.to_string(),
        format!("{}:80", SERVER_IPS[0])
    );
    assert_fetch_ok(&daemon, &id, "http://sub.wild.example.test/").await;
    assert_fetch_ok(&daemon, &id, "http://deep.sub.wild.example.test/").await;
    assert_refused_fast(&daemon, &id, "http://wild.example.test/").await;
    assert_refused_fast(&daemon, &id, "http://denied.example.test/").await;

    // A name whose addresses are loopback, private and metadata before a
    // public one: the proxy dials exactly the one that passed.
    let before = upstream.accepted().len();
    assert_fetch_ok(&daemon, &id, "http://mixed.example.test/").await;
    let accepted = upstream.accepted();
    assert_eq!(accepted.len(), before + 1, "{accepted:?}");
    assert_eq!(
        accepted[before].local.to_string(),
        format!("{}:80", SERVER_IPS[1])
    );
    let log = daemon.egress_log(&id).await;
    assert!(
        log.iter().any(|e| e["host"] == "mixed.example.test"
            && e["verdict"] == "allowed"
            && e["address"] == format!("{}:80", SERVER_IPS[1])),
        "{log:?}"
    );
    // Listed, but it only resolves to a private address.
    assert_refused_fast(&daemon, &id, "http://private.example.test/").await;

    // No IP entry: a literal address is refused.
    assert_refused_fast(&daemon, &id, &format!("http://{}/", SERVER_IPS[0])).await;
    // Straight to the proxy's port: not redirected, refused.
    assert_refused_fast(&daemon, &id, "http://10.200.0.2:15001/").await;
    assert_refused_fast(&daemon, &id, "http://127.0.0.1:15001/").await;

    // A second request on a kept-alive connection naming another host.
    let script = format!(
        "printf 'GET / HTTP/1.1\\r\\nHost: allowed.example.test\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: other.example.test\\r\\n\\r\\n' | nc -w 3 {} 80",
        SERVER_IPS[0]
    );
    let run = daemon.sh(&id, &script).await;
    assert!(
        run.out().matches(BODY).count() <= 1,
        "the second request went through: {}",
        run.out()
    );

    // A policy change applies to the next connection.
    let v = set_policy(&daemon, &id, json!({"block_network": true})).await;
    assert_eq!(v["network"]["mode"], "block", "{v}");
    assert_refused_fast(&daemon, &id, "http://allowed.example.test/").await;
    set_policy(
        &daemon,
        &id,
        json!({"allow_list": [SERVER_IPS[0], "10.0.0.0/8", "169.254.169.254"]}),
    )
    .await;
    // IP entries match the original destination.
    assert_fetch_ok(&daemon, &id, &format!("http://{}/", SERVER_IPS[0])).await;
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
    assert_fetch_ok(&daemon, &id, &format!("http://{}/", SERVER_IPS[0])).await;

    // Every connection is in the sandbox's egress log, with its verdict.
    let log = daemon.egress_log(&id).await;
    assert!(
        log.iter().any(|e| e["verdict"] == "allowed"
            && e["host"] == SERVER_IPS[0]
            && e["bytes"].as_u64() > Some(0)),
        "{log:?}"
    );
    assert!(
        log.iter().any(|e| e["verdict"] == "refused"
            && e["host"] == "169.254.169.254"
            && e["reason"].is_string()),
        "{log:?}"
    );

    // The proxy's work shows in the sandbox's usage and the daemon's metrics.
    let (_, sandbox) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert!(
        sandbox["usage"]["egress_bytes"].as_u64() > Some(0),
        "{sandbox}"
    );
    for verdict in ["allowed", "refused"] {
        await_metric(
            &daemon,
            "egress_connections_total",
            &format!("{{verdict=\"{verdict}\"}}"),
        )
        .await;
    }

    daemon.delete(&id).await;
    daemon.delete(&blocked).await;
}

#[tokio::test]
async fn https_is_matched_on_sni_with_curl_and_python() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &[]);
    let id = daemon
        .create(json!({
            "image": "python",
            "allow_list": ["allowed.example.test", "*.wild.example.test"]
        }))
        .await;
    let (status, v) = daemon
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/ca.pem"),
            upstream.ca_pem.clone().into_bytes(),
        )
        .await;
    assert!(status.is_success(), "{}", String::from_utf8_lossy(&v));

    // Through synthetic DNS, with curl and with Python's ssl.
    let run = curl(
        &daemon,
        &id,
        &["--cacert", "/tmp/ca.pem"],
        "https://allowed.example.test/",
    )
    .await;
    assert_eq!(run.out(), BODY, "{}", run.err());
    let python = "import ssl, sys, urllib.request\n\
        ctx = ssl.create_default_context(cafile='/tmp/ca.pem')\n\
        print(urllib.request.urlopen(sys.argv[1], context=ctx, timeout=10).read().decode())";
    let run = daemon
        .exec(
            &id,
            &["python3", "-c", python, "https://sub.wild.example.test/"],
        )
        .await;
    assert_eq!(run.out().trim(), BODY, "{}", run.err());

    // Straight to the server's address: the SNI names the host.
    let at_ip = |name: &str| format!("{name}:443:{}", SERVER_IPS[0]);
    let allowed_at_ip = at_ip("allowed.example.test");
    let pinned = [
        "--cacert",
        "/tmp/ca.pem",
        "--resolve",
        allowed_at_ip.as_str(),
    ];
    let run = curl(&daemon, &id, &pinned, "https://allowed.example.test/").await;
    assert_eq!(run.out(), BODY, "{}", run.err());
    let begun = Instant::now();
    let denied_at_ip = at_ip("denied.example.test");
    let pinned = [
        "--cacert",
        "/tmp/ca.pem",
        "--resolve",
        denied_at_ip.as_str(),
    ];
    let run = curl(&daemon, &id, &pinned, "https://denied.example.test/").await;
    assert_ne!(run.exit_code(), Some(0), "{}", run.out());
    assert!(
        begun.elapsed() < Duration::from_secs(3),
        "{:?}",
        begun.elapsed()
    );
    // A name that is not listed does not even resolve.
    let run = curl(&daemon, &id, &[], "https://denied.example.test/").await;
    assert_eq!(
        run.exit_code(),
        Some(6),
        "curl: could not resolve; {}",
        run.err()
    );

    let log = daemon.egress_log(&id).await;
    assert!(
        log.iter().any(|e| e["host"] == "denied.example.test"
            && e["port"] == 443
            && e["verdict"] == "refused"),
        "{log:?}"
    );
    daemon.delete(&id).await;
}

#[tokio::test]
async fn a_policy_change_closes_a_forbidden_open_connection() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &[]);
    let id = daemon
        .create(json!({"image": "python", "allow_list": ["allowed.example.test"]}))
        .await;
    let python = "import socket, time\n\
        s = socket.create_connection(('allowed.example.test', 80), timeout=60)\n\
        s.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.example.test\\r\\n\\r\\n')\n\
        got = b''\n\
        while not got.endswith(b'hello from upstream'):\n\
        \x20   chunk = s.recv(4096)\n\
        \x20   if not chunk: break\n\
        \x20   got += chunk\n\
        print('first', len(got), flush=True)\n\
        begun = time.monotonic()\n\
        try:\n    end = 'eof %d' % len(s.recv(4096))\n\
        except OSError as e:\n    end = 'error %s' % e\n\
        print(end, 'after %.1f s' % (time.monotonic() - begun), flush=True)";
    let proc = daemon
        .start_process(&id, json!({"argv": ["python3", "-c", python]}))
        .await;
    let mut output = daemon.follow_output(&id, proc).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let text = |events: &[Value]| -> String {
        events
            .iter()
            .filter(|e| e["type"] == "stdout")
            .filter_map(|e| b64.decode(e["data"].as_str()?).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect()
    };
    let seen = output
        .until(Duration::from_secs(20), |e| {
            e["type"] == "stdout" || e["type"] == "exit"
        })
        .await;
    assert!(text(&seen).starts_with("first"), "{seen:?}");

    // Still allowed: the open connection is left alone.
    set_policy(
        &daemon,
        &id,
        json!({"allow_list": ["allowed.example.test", "x.test"]}),
    )
    .await;
    assert_eq!(
        daemon
            .call(
                Method::GET,
                &format!("/v1/sandboxes/{id}/processes/{proc}"),
                None
            )
            .await
            .1["state"],
        "running"
    );
    // Forbidden now: closed at once.
    set_policy(&daemon, &id, json!({"allow_list": ["other.example.test"]})).await;
    let rest = output
        .until(Duration::from_secs(20), |e| e["type"] == "exit")
        .await;
    let end = text(&rest);
    assert!(
        end.starts_with("eof 0") || end.starts_with("error"),
        "the connection was not closed: {end}"
    );
    let log = daemon.egress_log(&id).await;
    assert!(
        log.iter()
            .any(|e| e["host"] == "allowed.example.test" && e["reason"] == "the policy changed"),
        "{log:?}"
    );
    daemon.delete(&id).await;
}

#[tokio::test]
async fn nothing_on_the_host_is_reachable_even_when_open() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &["--default-egress", "open"]);
    // A service on the host: on loopback and on every address.
    let listener = TcpListener::bind(("0.0.0.0", 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let host_ip = sandboxd::net::deny::host_interface_addresses()
        .expect("addresses")
        .into_iter()
        .find(|ip| matches!(ip, IpAddr::V4(v4) if !v4.is_loopback()))
        .expect("a non-loopback IPv4 address on the host");
    let id = daemon.create(json!({"image": "busybox"})).await;
    assert_eq!(network_view(&daemon, &id).await["mode"], "open");
    // Open means the public internet: the test servers work...
    assert_fetch_ok(&daemon, &id, "http://allowed.example.test/").await;
    // ...the host does not: its loopback (the sandbox's own lo answers),
    // its own addresses, the upstream namespace's, and the daemon's socket.
    assert_refused_fast(&daemon, &id, &format!("http://127.0.0.1:{port}/")).await;
    assert_refused_fast(&daemon, &id, &format!("http://{host_ip}:{port}/")).await;
    assert_refused_fast(&daemon, &id, &format!("http://{UPSTREAM_IP}:{port}/")).await;
    assert!(
        listener.accept().is_err(),
        "a sandbox reached a host service"
    );
    let run = daemon
        .sh(
            &id,
            &format!(
                "test -e {} && echo VISIBLE; test -e {} && echo VISIBLE; echo checked",
                daemon.socket.display(),
                daemon.run_dir().display()
            ),
        )
        .await;
    assert_eq!(run.out(), "checked\n", "the daemon's files are visible");
    // Another sandbox's services: every sandbox has the same address, which
    // inside a sandbox is itself; there is no route to the others.
    let other = daemon.create(json!({"image": "busybox"})).await;
    daemon
        .start_process(&other, json!({"argv": ["nc", "-l", "-p", "8080"]}))
        .await;
    assert_refused_fast(&daemon, &id, "http://10.200.0.2:8080/").await;
    assert_refused_fast(&daemon, &id, "http://10.200.0.1:8080/").await;
    daemon.delete(&other).await;
    daemon.delete(&id).await;
}

#[tokio::test]
async fn per_sandbox_caps_hold_and_show_in_metrics() {
    require_host!();
    let upstream = Upstream::start();
    // 8 Mbit/s is 1 MB/s each way.
    let daemon = daemon(
        &upstream,
        &[
            "--egress-max-connections",
            "8",
            "--egress-dns-qps",
            "5",
            "--egress-bandwidth-mbit",
            "8",
        ],
    );
    let id = daemon
        .create(json!({"image": "python", "allow_list": ["allowed.example.test"]}))
        .await;
    // The name is resolved once: the connections and the download below
    // must not depend on the DNS cap this also exhausts.
    let python = "import socket, time\n\
        ip = socket.gethostbyname('allowed.example.test')\n\
        held, refused = [], 0\n\
        for _ in range(12):\n\
        \x20   s = socket.create_connection((ip, 80), timeout=10)\n\
        \x20   try:\n\
        \x20       s.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.example.test\\r\\n\\r\\n')\n\
        \x20       if s.recv(4096):\n\
        \x20           held.append(s)\n\
        \x20           continue\n\
        \x20   except OSError: pass\n\
        \x20   refused += 1\n\
        print(len(held), refused)\n\
        for s in held: s.close()\n\
        fails = 0\n\
        for _ in range(20):\n\
        \x20   try: socket.getaddrinfo('allowed.example.test', 80)\n\
        \x20   except OSError: fails += 1\n\
        print(fails)\n\
        begun = time.monotonic()\n\
        s = socket.create_connection((ip, 80), timeout=30)\n\
        s.sendall(b'GET /big HTTP/1.1\\r\\nHost: allowed.example.test\\r\\n\\r\\n')\n\
        got = 0\n\
        while got < %d:\n\
        \x20   chunk = s.recv(65536)\n\
        \x20   if not chunk: break\n\
        \x20   got += len(chunk)\n\
        print(got, round(time.monotonic() - begun, 2))";
    let python = python.replace("%d", &BIG_LEN.to_string());
    let run = daemon.exec(&id, &["python3", "-c", &python]).await;
    assert_eq!(run.exit_code(), Some(0), "{}{}", run.out(), run.err());
    let out = run.out();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"8 4"),
        "8 connections held, 4 refused: {out}"
    );
    let dns_fails: u32 = lines.get(1).and_then(|l| l.parse().ok()).unwrap_or(0);
    assert!(dns_fails >= 10, "20 lookups at 5 per second: {out}");
    let (got, secs) = lines
        .get(2)
        .and_then(|l| l.split_once(' '))
        .and_then(|(g, s)| Some((g.parse::<usize>().ok()?, s.parse::<f64>().ok()?)))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(got >= BIG_LEN, "{out}");
    // 3 MB (plus headers) at 1 MB/s after a 100 kB burst: not under 2.5 s.
    assert!(secs >= 2.5, "the bandwidth cap did not hold: {out}");

    await_metric(&daemon, "egress_limited_total", "{limit=\"connections\"}").await;
    await_metric(&daemon, "egress_limited_total", "{limit=\"dns_qps\"}").await;
    await_metric(&daemon, "egress_throttled_seconds_total", "").await;
    daemon.delete(&id).await;
}

#[tokio::test]
async fn a_flooding_sandbox_does_not_stall_another() {
    require_host!();
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &[]);
    let flooder = daemon
        .create(json!({"image": "python", "allow_list": ["allowed.example.test"]}))
        .await;
    let quiet = daemon
        .create(json!({"image": "busybox", "allow_list": ["allowed.example.test"]}))
        .await;
    // Opens connections as fast as it can and holds them, well past its cap.
    let flood = "import socket\n\
        ip = socket.gethostbyname('allowed.example.test')\n\
        held = []\n\
        print('flooding', flush=True)\n\
        while True:\n\
        \x20   try: held.append(socket.create_connection((ip, 80), timeout=5))\n\
        \x20   except OSError: pass\n\
        \x20   if len(held) > 900: held = held[300:]";
    let proc = daemon
        .start_process(&flooder, json!({"argv": ["python3", "-c", flood]}))
        .await;
    let mut output = daemon.follow_output(&flooder, proc).await;
    output
        .until(Duration::from_secs(20), |e| e["type"] == "stdout")
        .await;
    for _ in 0..5 {
        let (ok, out, secs) = fetch(&daemon, &quiet, "http://allowed.example.test/").await;
        assert!(ok && out.contains(BODY), "{out}");
        assert!(
            secs < 2.0,
            "the quiet sandbox's fetch took {secs:.2}s: {out}"
        );
    }
    await_metric(&daemon, "egress_limited_total", "{limit=\"connections\"}").await;
    daemon.delete(&flooder).await;
    daemon.delete(&quiet).await;
}
