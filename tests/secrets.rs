//! Root-only: brokered secrets seen from inside container sandboxes. The
//! "internet" is `common/upstream.rs`'s namespaces, with `common/echo.rs`'s
//! HTTPS server for `api.example.test` (the bound host) and
//! `second.example.test` (allowed, not bound), which records the headers
//! and bodies it gets. Nothing leaves the machine.

mod common;
#[path = "common/echo.rs"]
mod echo;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use common::Daemon;
use echo::Echo;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use upstream::Upstream;

const VALUE: &str = "sk-live-REAL-0123456789abcdef";
const PREFIX: &str = "sandboxd-placeholder-";

fn daemon(upstream: &Upstream, echo: &Echo) -> Daemon {
    daemon_with(upstream, echo, &[])
}

fn daemon_with(upstream: &Upstream, echo: &Echo, extra: &[&str]) -> Daemon {
    let mut flags = upstream.daemon_flags();
    flags.push("--egress-extra-ca".into());
    flags.push(echo.ca_path.display().to_string());
    flags.extend(extra.iter().map(|f| f.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Daemon::start_with(&flags)
}

async fn create_secret(daemon: &Daemon, name: &str, value: &str, hosts: &[&str]) {
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/secrets",
            Some(json!({"name": name, "value": value, "hosts": hosts})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert!(!v.to_string().contains(value), "{v}");
}

async fn rotate(daemon: &Daemon, name: &str, body: Value) {
    let (status, v) = daemon
        .call(Method::PUT, &format!("/v1/secrets/{name}"), Some(body))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// Puts the echo servers' CA at /tmp/echo-ca.pem in `id`, for clients
/// that reach them without the secrets CA.
async fn put_echo_ca(daemon: &Daemon, echo: &Echo, id: &str) {
    let (status, v) = daemon
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/echo-ca.pem"),
            echo.ca_pem.clone().into_bytes(),
        )
        .await;
    assert!(status.is_success(), "{}", String::from_utf8_lossy(&v));
}

/// Runs `script` with sh in `id`, asserting it exits 0; its stdout.
async fn sh_ok(daemon: &Daemon, id: &str, script: &str) -> String {
    let run = daemon.sh(id, script).await;
    assert_eq!(
        run.exit_code(),
        Some(0),
        "{script}\nstdout: {}\nstderr: {}\nsupervisor log:\n{}",
        run.out(),
        run.err(),
        supervisor_log(daemon, id)
    );
    run.out()
}

async fn python_ok(daemon: &Daemon, id: &str, code: &str) -> String {
    let run = daemon.exec(id, &["python3", "-c", code]).await;
    assert_eq!(
        run.exit_code(),
        Some(0),
        "{code}\nstdout: {}\nstderr: {}\nsupervisor log:\n{}",
        run.out(),
        run.err(),
        supervisor_log(daemon, id)
    );
    run.out()
}

fn supervisor_log(daemon: &Daemon, id: &str) -> String {
    std::fs::read_to_string(daemon.run_dir().join("sandboxes").join(id).join("shim.log"))
        .or_else(|_| std::fs::read_to_string(daemon.run_dir().join(id).join("shim.log")))
        .unwrap_or_default()
}

/// The one request the echo server got at `path`.
fn one_at(echo: &Echo, path: &str) -> echo::Seen {
    let seen = echo.seen_at(path);
    assert_eq!(seen.len(), 1, "requests at {path}: {seen:?}");
    seen.into_iter().next().expect("one")
}

async fn env_of(daemon: &Daemon, id: &str, name: &str) -> String {
    sh_ok(daemon, id, &format!("printf %s \"${name}\"")).await
}

fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// Every pid in the sandbox's groups (init, agent, each process's group).
fn sandbox_pids(id: &str) -> Vec<i32> {
    fn walk(dir: &Path, out: &mut Vec<i32>) {
        out.extend(common::cgroup::procs_in(dir));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&common::cgroup::sandbox_dir("pids", id), &mut out);
    out.sort();
    out.dedup();
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// Which of `needles` appear in the writable memory of process `pid`
/// (every `rw` range of /proc/PID/maps, read through /proc/PID/mem).
fn found_in_memory(pid: i32, needles: &[&[u8]]) -> Vec<bool> {
    let mut found = vec![false; needles.len()];
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return found;
    };
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return found;
    };
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        let len = (end - start).min(256 << 20) as usize;
        let mut buf = vec![0u8; len];
        // Ranges such as [vvar] answer EIO; they hold nothing of ours.
        let Ok(n) = mem.read_at(&mut buf, start) else {
            continue;
        };
        for (i, needle) in needles.iter().enumerate() {
            found[i] |= contains(&buf[..n], needle);
        }
    }
    found
}

/// The sandbox's writable layer on the host, from its init's mount table.
fn upper_dir(init_pid: i32) -> PathBuf {
    let info = std::fs::read_to_string(format!("/proc/{init_pid}/mountinfo")).expect("mountinfo");
    let line = info
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    let upper = line
        .split(',')
        .find_map(|o| o.strip_prefix("upperdir="))
        .unwrap_or_else(|| panic!("no upperdir in {line}"));
    PathBuf::from(upper.split_whitespace().next().expect("path"))
}

/// Paths of the files under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            out.extend(files_holding(&path, needle));
        } else if kind.is_file() {
            let mut bytes = Vec::new();
            if std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .is_ok()
                && contains(&bytes, needle)
            {
                out.push(path);
            }
        }
    }
    out
}

#[tokio::test]
async fn a_bound_secret_goes_only_into_https_headers_to_its_host() {
    require_host!();
    let upstream = Upstream::start();
    let echo = Echo::start(&upstream);
    let daemon = daemon(&upstream, &echo);
    create_secret(&daemon, "API_KEY", VALUE, &["api.example.test"]).await;
    let id = daemon
        .create(json!({
            "image": "python",
            "allow_list": ["second.example.test"],
            "secrets": ["API_KEY"],
        }))
        .await;
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(view["secrets"], json!(["API_KEY"]), "{view}");
    let placeholder = env_of(&daemon, &id, "API_KEY").await;
    assert!(placeholder.starts_with(PREFIX), "{placeholder}");
    assert_ne!(placeholder, VALUE);

    // curl, HTTP/1.1 and HTTP/2, with the trust bundle the sandbox got.
    for (flag, path, version) in [
        ("--http1.1", "/h1", "HTTP/1.1"),
        ("--http2", "/h2", "HTTP/2.0"),
    ] {
        let curl = format!(
            r#"curl -sS --max-time 10 {flag} -H "Authorization: Bearer $API_KEY" -H "x-api-key: $API_KEY" https://api.example.test{path}"#
        );
        sh_ok(&daemon, &id, &curl).await;
        let seen = one_at(&echo, path);
        assert_eq!(
            seen.authorization,
            Some(format!("Bearer {VALUE}")),
            "{flag}"
        );
        assert_eq!(seen.api_key.as_deref(), Some(VALUE), "{flag}");
        assert_eq!(seen.version, version);
    }
    // Basic auth: decoded, substituted, encoded again.
    sh_ok(
        &daemon,
        &id,
        r#"curl -sS --max-time 10 -u "user:$API_KEY" https://api.example.test/basic"#,
    )
    .await;
    let expect = basic(&format!("user:{VALUE}"));
    assert_eq!(
        one_at(&echo, "/basic").authorization.as_deref(),
        Some(expect.as_str())
    );

    // Python's urllib and http.client, with ten requests on one connection
    // and one naming another host, which is refused and never arrives.
    python_ok(&daemon, &id, "import os, urllib.request\n\
        req = urllib.request.Request('https://api.example.test/urllib', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']})\n\
        print(urllib.request.urlopen(req, timeout=10).read().decode())").await;
    assert_eq!(
        one_at(&echo, "/urllib").authorization.as_deref(),
        Some(format!("Bearer {VALUE}").as_str())
    );
    let out = python_ok(&daemon, &id, "import os, http.client\n\
        c = http.client.HTTPSConnection('api.example.test', timeout=10)\n\
        for i in range(10):\n\
        \x20   c.request('GET', '/keepalive', headers={'x-api-key': os.environ['API_KEY']})\n\
        \x20   r = c.getresponse(); r.read(); assert r.status == 200, r.status\n\
        c.request('GET', '/misdirected', headers={'Host': 'second.example.test', 'x-api-key': os.environ['API_KEY']})\n\
        r = c.getresponse(); r.read(); print('misdirected', r.status)").await;
    assert!(out.contains("misdirected 421"), "{out}");
    let kept = echo.seen_at("/keepalive");
    assert_eq!(kept.len(), 10, "{kept:?}");
    assert!(
        kept.iter().all(|s| s.api_key.as_deref() == Some(VALUE)),
        "{kept:?}"
    );
    assert!(
        kept.iter().all(|s| s.connection == kept[0].connection),
        "one upstream connection: {kept:?}"
    );
    assert!(echo.seen_at("/misdirected").is_empty());

    // Another allowed host gets the placeholder; so does a body, and
    // cleartext HTTP to the bound host.
    put_echo_ca(&daemon, &echo, &id).await;
    sh_ok(&daemon, &id, r#"curl -sS --max-time 10 --cacert /tmp/echo-ca.pem -H "x-api-key: $API_KEY" https://second.example.test/second"#).await;
    assert_eq!(
        one_at(&echo, "/second").api_key.as_deref(),
        Some(placeholder.as_str())
    );
    sh_ok(
        &daemon,
        &id,
        r#"curl -sS --max-time 10 --data-binary "$API_KEY" https://api.example.test/body"#,
    )
    .await;
    assert_eq!(one_at(&echo, "/body").body, placeholder.as_bytes());
    sh_ok(
        &daemon,
        &id,
        r#"curl -sS --max-time 10 -H "x-api-key: $API_KEY" http://api.example.test/plain"#,
    )
    .await;
    let plain = one_at(&echo, "/plain");
    assert!(!plain.tls);
    assert_eq!(plain.api_key.as_deref(), Some(placeholder.as_str()));

    // A websocket to the bound host, both ways, after a rewritten handshake.
    let out = python_ok(&daemon, &id, WEBSOCKET_CLIENT).await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["one", "two", "HTTP/1.1 101 Switching Protocols"],
        "{out}"
    );
    assert_eq!(
        one_at(&echo, "/ws").authorization.as_deref(),
        Some(format!("Bearer {VALUE}").as_str())
    );

    // The egress log names the intercepted requests, never a value.
    let log = daemon.egress_log(&id).await;
    assert!(
        log.iter().any(|e| e["verdict"] == "intercepted"
            && e["request"]["path"] == "/h1"
            && e["request"]["status"] == 200
            && e["request"]["secrets"] == json!(["API_KEY"])),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|e| e["verdict"] == "refused" && e["request"]["path"] == "/misdirected"),
        "{log:?}"
    );
    let substituted = daemon
        .await_metric("sandboxd_secret_substitutions_total{secret=\"API_KEY\"} ")
        .await;
    assert!(substituted >= 15.0, "{substituted}");

    // A sandbox without secrets sees the real certificate: nothing is
    // intercepted, and the daemon's CA is not in its trust store.
    let plain_id = daemon
        .create(json!({"image": "python", "allow_list": ["api.example.test"]}))
        .await;
    put_echo_ca(&daemon, &echo, &plain_id).await;
    let run = daemon
        .sh(&plain_id, "curl -sS -v --max-time 10 --cacert /tmp/echo-ca.pem -H 'x-api-key: mine' https://api.example.test/unbound 2>&1")
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.out());
    assert!(
        run.out().contains("sandboxd echo test CA"),
        "the upstream's own issuer: {}",
        run.out()
    );
    assert_eq!(one_at(&echo, "/unbound").api_key.as_deref(), Some("mine"));
    let run = daemon
        .sh(
            &plain_id,
            "curl -sS --max-time 10 https://api.example.test/untrusted",
        )
        .await;
    assert_ne!(
        run.exit_code(),
        Some(0),
        "the echo CA is not in the image's roots"
    );

    // The value is nowhere the sandbox can read: not in any process's
    // memory (the placeholder is: a positive control for the scan)...
    let holder = daemon
        .start_process(&id, json!({"argv": ["python3", "-c", "import os, sys, time\nkey = os.environ['API_KEY']\nsys.stdout.write('up\\n'); sys.stdout.flush()\ntime.sleep(600)"]}))
        .await;
    let mut follow = daemon.follow_output(&id, holder).await;
    follow
        .until(Duration::from_secs(20), |e| e["type"] == "stdout")
        .await;
    let pids = sandbox_pids(&id);
    assert!(pids.len() >= 2, "{pids:?}");
    let mut placeholder_seen = false;
    for pid in &pids {
        let found = found_in_memory(*pid, &[VALUE.as_bytes(), placeholder.as_bytes()]);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !found[0],
            "the value is in the memory of sandbox process {pid} ({})",
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        );
        placeholder_seen |= found[1];
    }
    assert!(
        placeholder_seen,
        "the scan found no placeholder in {pids:?}"
    );
    // ...not in its files (its writable layer holds the placeholder where
    // it was written, and the trust bundle)...
    sh_ok(
        &daemon,
        &id,
        r#"printf %s "$API_KEY" > /tmp/placeholder.txt"#,
    )
    .await;
    let init = sandbox_pids(&id)[0];
    let upper = upper_dir(init);
    assert!(
        files_holding(&upper, VALUE.as_bytes()).is_empty(),
        "{upper:?}"
    );
    assert!(
        !files_holding(&upper, placeholder.as_bytes()).is_empty(),
        "positive control: {upper:?} holds /tmp/placeholder.txt"
    );
    let bundle = sh_ok(&daemon, &id, "cat $SSL_CERT_FILE").await;
    assert!(bundle.contains("BEGIN CERTIFICATE"), "{bundle}");
    // ...nor in the supervisor's files (its config holds the environment,
    // so the placeholder: the positive control)...
    let run_dir = daemon.run_dir();
    assert!(
        files_holding(&run_dir, VALUE.as_bytes()).is_empty(),
        "{run_dir:?}"
    );
    assert!(
        !files_holding(&run_dir, placeholder.as_bytes()).is_empty(),
        "positive control: the supervisor's config in {run_dir:?} names the placeholder"
    );
    // ...nor in the API, the events, the metrics or the daemon's log.
    for path in [
        format!("/v1/sandboxes/{id}"),
        "/v1/sandboxes".to_string(),
        "/v1/secrets".to_string(),
        "/v1/secrets/API_KEY".to_string(),
        format!("/v1/sandboxes/{id}/network/log"),
        "/v1/events?follow=false".to_string(),
        "/metrics".to_string(),
    ] {
        let (status, body) = daemon.raw(Method::GET, &path, Vec::new()).await;
        assert!(status.is_success(), "{path}: {status}");
        assert!(!contains(&body, VALUE.as_bytes()), "{path} shows the value");
    }
    let (_, secrets) = daemon.raw(Method::GET, "/v1/secrets", Vec::new()).await;
    assert!(contains(&secrets, b"API_KEY"), "positive control");
    let log = daemon.log();
    assert!(
        log.contains("API_KEY"),
        "positive control: the log names the secret"
    );
    assert!(!log.contains(VALUE), "the daemon's log shows the value");
    assert!(!supervisor_log(&daemon, &id).contains(VALUE));
    daemon.delete(&id).await;
    daemon.delete(&plain_id).await;
}

/// A websocket client on Python's standard library: sends "one" and "two"
/// to /ws, prints the echoes, then the status line of the handshake.
const WEBSOCKET_CLIENT: &str = r#"
import base64, os, socket, ssl
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection(("api.example.test", 443), timeout=10), server_hostname="api.example.test")
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: api.example.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\n"
    "Authorization: Bearer " + os.environ["API_KEY"] + "\r\n\r\n").encode())
def recvn(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError(b)
        b += c
    return b
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += recvn(1)
def send(text):
    data, mask = text.encode(), os.urandom(4)
    s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
def recv():
    h = recvn(2)
    return recvn(h[1] & 0x7f).decode()
for m in ["one", "two"]:
    send(m)
    print(recv())
print(head.split(b"\r\n")[0].decode())
"#;

/// Two requests on one connection, each after a line on stdin.
const TWO_REQUESTS_ONE_CONNECTION: &str = r#"
import os, sys, http.client
c = http.client.HTTPSConnection('api.example.test', timeout=10)
for path in ['/before', '/after']:
    c.request('GET', path, headers={'x-api-key': os.environ['ROTATED']})
    r = c.getresponse(); r.read(); print(path, r.status, flush=True)
    sys.stdin.readline()
"#;

/// A sandbox with secrets trusts its image's roots (the host's where the
/// image has none) and then the broker's CA, in a bundle its code can read,
/// however it got there: written into a container's root from the host
/// over the image's file (python), or made by the agent where the image
/// has none (busybox).
#[tokio::test]
async fn the_trust_bundle_holds_the_images_roots_then_the_brokers_ca() {
    require_host!();
    let daemon = Daemon::start();
    create_secret(&daemon, "API_KEY", VALUE, &["api.example.test"]).await;
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    let marker = "# sandboxd secrets broker CA";
    let read = format!("cat {bundle}");
    let plain = daemon.create(json!({"image": "python"})).await;
    let image_roots = sh_ok(&daemon, &plain, &read).await;
    assert!(image_roots.contains("BEGIN CERTIFICATE"), "{image_roots}");
    assert!(!image_roots.contains(marker), "no CA without secrets");

    for image in ["python", "busybox"] {
        let id = daemon
            .create(json!({"image": image, "secrets": ["API_KEY"]}))
            .await;
        let got = sh_ok(&daemon, &id, &read).await;
        let (roots, ca) = got
            .split_once(marker)
            .unwrap_or_else(|| panic!("{image}: no broker CA in {got}"));
        assert!(ca.trim().starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        assert!(roots.contains("BEGIN CERTIFICATE"), "{image}: no roots");
        if image == "python" {
            assert_eq!(roots, image_roots, "the image's own roots, first");
        }
        let owner = sh_ok(&daemon, &id, &format!("stat -c '%u %a' {bundle}")).await;
        assert_eq!(owner.trim(), "0 644", "{image}");
    }
    let still = sh_ok(&daemon, &plain, &read).await;
    assert_eq!(still, image_roots, "a sandbox without secrets is untouched");
}

#[tokio::test]
async fn rotation_deletion_forks_and_policy_changes_follow_the_secret() {
    require_host!();
    let upstream = Upstream::start();
    let echo = Echo::start(&upstream);
    let daemon = daemon(&upstream, &echo);
    create_secret(&daemon, "ROTATED", "value-one", &["api.example.test"]).await;
    // block_network plus a secret: only the secret's host is reachable.
    let id = daemon
        .create(json!({"image": "python", "block_network": true, "secrets": ["ROTATED"]}))
        .await;
    let placeholder = env_of(&daemon, &id, "ROTATED").await;
    let request = |path: &str| {
        format!(r#"curl -sS --max-time 10 -H "x-api-key: $ROTATED" https://api.example.test{path}"#)
    };
    sh_ok(&daemon, &id, &request("/first")).await;
    assert_eq!(
        one_at(&echo, "/first").api_key.as_deref(),
        Some("value-one")
    );
    let run = daemon
        .sh(&id, "curl -sS --max-time 10 https://second.example.test/")
        .await;
    assert_eq!(
        run.exit_code(),
        Some(6),
        "not resolvable under block: {}",
        run.err()
    );

    // Rotation reaches the next request of an open connection: the client
    // waits on its stdin between two requests on one connection.
    let proc = daemon
        .start_process(
            &id,
            json!({
                "argv": ["python3", "-c", TWO_REQUESTS_ONE_CONNECTION],
                "stdin": true,
            }),
        )
        .await;
    let mut follow = daemon.follow_output(&id, proc).await;
    follow
        .until(Duration::from_secs(20), |e| e["type"] == "stdout")
        .await;
    rotate(&daemon, "ROTATED", json!({"value": "value-two"})).await;
    let (status, _) = daemon
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
            b"go\n".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = daemon
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{proc}/stdin"),
            b"go\n".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let done = daemon.output(&id, proc).await;
    assert_eq!(done.exit_code(), Some(0), "{} {}", done.out(), done.err());
    let (before, after) = (one_at(&echo, "/before"), one_at(&echo, "/after"));
    assert_eq!(before.api_key.as_deref(), Some("value-one"));
    assert_eq!(after.api_key.as_deref(), Some("value-two"));
    assert_eq!(before.connection, after.connection, "the same connection");

    // A policy change keeps the secret's host reachable.
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(json!({"block_network": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    sh_ok(&daemon, &id, &request("/patched")).await;
    assert_eq!(
        one_at(&echo, "/patched").api_key.as_deref(),
        Some("value-two")
    );

    // A fork from a memory snapshot keeps the placeholder and the binding,
    // and follows the next rotation.
    let (status, snap) = daemon
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"kind": "memory"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap = snap["id"].as_str().expect("snapshot id").to_string();
    // The snapshot holds the processes' memory: the placeholder, never a value.
    let snap_dir = daemon.state_dir().join("disk/snapshots").join(&snap);
    assert!(
        files_holding(&snap_dir, b"value-two").is_empty(),
        "{snap_dir:?}"
    );
    assert!(
        !files_holding(&snap_dir, placeholder.as_bytes()).is_empty(),
        "positive control: {snap_dir:?} holds the processes' environment"
    );
    let fork = daemon.create(json!({"from_snapshot": snap})).await;
    assert_eq!(env_of(&daemon, &fork, "ROTATED").await, placeholder);
    sh_ok(&daemon, &fork, &request("/fork")).await;
    assert_eq!(one_at(&echo, "/fork").api_key.as_deref(), Some("value-two"));
    rotate(&daemon, "ROTATED", json!({"value": "value-three"})).await;
    sh_ok(&daemon, &fork, &request("/fork-rotated")).await;
    assert_eq!(
        one_at(&echo, "/fork-rotated").api_key.as_deref(),
        Some("value-three")
    );

    // Deleting the secret stops substitution everywhere, forks included.
    let (status, _) = daemon
        .raw(Method::DELETE, "/v1/secrets/ROTATED", Vec::new())
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, v) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{fork}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["secrets"], json!([]), "{v}");
    let deleted = |name: &str| {
        format!(
            r#"curl -sS --max-time 10 --cacert /tmp/echo-ca.pem -H "x-api-key: $ROTATED" https://api.example.test{name}"#
        )
    };
    for (sandbox, path) in [(&id, "/deleted"), (&fork, "/deleted-fork")] {
        put_echo_ca(&daemon, &echo, sandbox).await;
        // Its host is no longer the secret's: under block_network it is
        // not reachable at all, and the placeholder never went out.
        let run = daemon.sh(sandbox, &deleted(path)).await;
        assert_ne!(run.exit_code(), Some(0), "{}", run.out());
        assert!(echo.seen_at(path).is_empty(), "{path}");
    }
    // With the host allowed again, the placeholder goes out as is.
    let (status, v) = daemon
        .call(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}/network"),
            Some(json!({"allow_list": ["api.example.test"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    sh_ok(&daemon, &id, &deleted("/after-delete")).await;
    assert_eq!(
        one_at(&echo, "/after-delete").api_key.as_deref(),
        Some(placeholder.as_str())
    );
    daemon.delete(&fork).await;
    daemon.delete(&id).await;
}

#[tokio::test]
async fn bad_secrets_are_refused_naming_the_field() {
    require_host!();
    let daemon = Daemon::start();
    let long = "v".repeat(17 * 1024);
    let cases = [
        (
            json!({"name": "1BAD", "value": "v", "hosts": ["a.example.test"]}),
            "name",
        ),
        (
            json!({"name": "A-B", "value": "v", "hosts": ["a.example.test"]}),
            "name",
        ),
        (
            json!({"name": "IP_HOST", "value": "v", "hosts": ["192.0.2.1"]}),
            "hosts",
        ),
        (
            json!({"name": "NO_HOSTS", "value": "v", "hosts": []}),
            "hosts",
        ),
        (
            json!({"name": "WILD", "value": "v", "hosts": ["*.example.test"]}),
            "allow_wildcards",
        ),
        (
            json!({"name": "EMPTY", "value": "", "hosts": ["a.example.test"]}),
            "value",
        ),
        (
            json!({"name": "LONG", "value": long, "hosts": ["a.example.test"]}),
            "value",
        ),
        (
            json!({"name": "NEWLINE", "value": "sk-new\nline", "hosts": ["a.example.test"]}),
            "value",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = daemon
            .call(Method::POST, "/v1/secrets", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
        let value = body["value"].as_str().unwrap_or_default();
        assert!(
            value.len() < 2 || !message.contains(value),
            "the error quotes the value: {message}"
        );
    }
    // The positive controls: a wildcard asked for, and a plain secret.
    let (status, v) = daemon
        .call(Method::POST, "/v1/secrets", Some(json!({"name": "WILD", "value": "v", "hosts": ["*.example.test"], "allow_wildcards": true})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["hosts"], json!(["*.example.test"]));
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/secrets",
            Some(json!({"name": "WILD", "value": "v", "hosts": ["a.example.test"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "secret_exists");
    let (status, v) = daemon.call(Method::GET, "/v1/secrets/NOPE", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = daemon
        .call(Method::PUT, "/v1/secrets/NOPE", Some(json!({"value": "x"})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");

    // An unknown secret at create, or one also named in env: 400, nothing made.
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"secrets": ["NOPE"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("secrets") && message.contains("NOPE"),
        "{message}"
    );
    let (status, v) = daemon
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"secrets": ["WILD"], "env": {"WILD": "x"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"], json!([]), "{list}");

    // The CLI: the value from stdin, never argv.
    let ctl = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(common::CTL)
            .arg("--socket")
            .arg(&daemon.socket)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run sandboxctl");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("sandboxctl");
        assert!(
            out.status.success(),
            "sandboxctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ctl(
        &["secret", "create", "CLI_KEY", "--host", "api.example.test"],
        "cli-value\n",
    );
    let listed = ctl(&["secret", "ls"], "");
    assert!(
        listed.contains("CLI_KEY") && listed.contains("api.example.test"),
        "{listed}"
    );
    assert!(!listed.contains("cli-value"), "{listed}");
    ctl(
        &[
            "secret",
            "rotate",
            "CLI_KEY",
            "--host",
            "second.example.test",
        ],
        "",
    );
    let (_, v) = daemon.call(Method::GET, "/v1/secrets/CLI_KEY", None).await;
    assert_eq!(v["hosts"], json!(["second.example.test"]), "{v}");
    assert!(v["rotated_at"].is_string(), "{v}");
    ctl(&["secret", "rm", "CLI_KEY"], "");
    let (status, _) = daemon.call(Method::GET, "/v1/secrets/CLI_KEY", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = daemon.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// The `detail` of sandbox `id`'s `created` event ("from the warm pool"
/// for a pool claim, none for a cold create), once it is ready.
async fn created_detail(events: &mut common::NdjsonStream, id: &str) -> Value {
    let seen = events
        .until(Duration::from_secs(60), |e| {
            e["kind"] == "ready" && e["sandbox_id"] == id
        })
        .await;
    seen.iter()
        .find(|e| e["kind"] == "created" && e["sandbox_id"] == id)
        .map(|e| e["detail"].clone())
        .unwrap_or_else(|| panic!("no created event for {id}: {seen:?}"))
}

/// A warm pool serves creates that ask for more than the pooled defaults
/// (secrets, an allow list, a blocked network, env, lower limits), each
/// put in force at the claim; one that asks for more than the pooled
/// limits starts cold.
#[tokio::test]
async fn a_pooled_sandbox_takes_the_callers_secrets_policy_and_lower_limits() {
    require_host!();
    let upstream = Upstream::start();
    let echo = Echo::start(&upstream);
    let daemon = daemon_with(&upstream, &echo, &["--pool-size", "2"]);
    create_secret(&daemon, "API_KEY", VALUE, &["api.example.test"]).await;
    daemon.pool_reaches(2).await;
    let mut events = daemon.follow_events(0).await;

    let id = daemon
        .create(json!({
            "allow_list": ["api.example.test"],
            "secrets": ["API_KEY"],
            "env": {"GREETING": "hi"},
            "cpu": 0.5, "memory_mib": 256, "pids": 64, "disk_mib": 64,
        }))
        .await;
    assert_eq!(created_detail(&mut events, &id).await, "from the warm pool");
    assert_eq!(env_of(&daemon, &id, "GREETING").await, "hi");
    let placeholder = env_of(&daemon, &id, "API_KEY").await;
    assert!(placeholder.starts_with(PREFIX), "{placeholder}");
    sh_ok(
        &daemon,
        &id,
        r#"curl -sS --max-time 10 -H "Authorization: Bearer $API_KEY" https://api.example.test/pooled"#,
    )
    .await;
    assert_eq!(
        one_at(&echo, "/pooled").authorization,
        Some(format!("Bearer {VALUE}"))
    );
    // The allow list: the echo server's other name is refused.
    let refused = daemon
        .sh(
            &id,
            "curl -sS --max-time 10 https://second.example.test/refused",
        )
        .await;
    assert_ne!(refused.exit_code(), Some(0), "{}", refused.out());
    assert!(echo.seen_at("/refused").is_empty());
    // The limits, lowered in the cgroups and the disk quota.
    assert_eq!(common::cgroup::memory_limit(&id), Some(256 << 20));
    assert_eq!(common::cgroup::pids_max(&id), "64");
    assert_eq!(common::cgroup::cpu_max(&id).0, Some(50_000));
    sh_ok(
        &daemon,
        &id,
        "dd if=/dev/zero of=/root/fits bs=1M count=16 2>/dev/null",
    )
    .await;
    let full = daemon
        .sh(&id, "dd if=/dev/zero of=/root/big bs=1M count=200")
        .await;
    assert_ne!(full.exit_code(), Some(0), "200 MiB written under 64 MiB");
    let (_, view) = daemon
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(view["limits"]["memory_mib"], 256, "{view}");
    assert_eq!(
        view["network"]["allow_list"],
        json!(["api.example.test"]),
        "{view}"
    );

    // The second pooled sandbox, with the network blocked.
    let blocked = daemon.create(json!({"block_network": true})).await;
    assert_eq!(
        created_detail(&mut events, &blocked).await,
        "from the warm pool"
    );
    let run = daemon
        .sh(
            &blocked,
            "curl -sS --max-time 10 https://api.example.test/blocked",
        )
        .await;
    assert_ne!(run.exit_code(), Some(0), "{}", run.out());
    assert!(echo.seen_at("/blocked").is_empty());
    // The trust bundles: the pool copied each up ahead, unchanged, and the
    // claim with a secret appended the CA to the image's roots; the other
    // kept the image's roots alone.
    let read = "cat /etc/ssl/certs/ca-certificates.crt";
    let image_roots = sh_ok(&daemon, &blocked, read).await;
    assert!(image_roots.contains("BEGIN CERTIFICATE"), "{image_roots}");
    // The copy-up reached the pooled root from the host, through its init
    // (no agent request puts a file there): the sandbox's own layer holds
    // the image's roots, unchanged.
    let copied = daemon
        .state_dir()
        .join("disk")
        .join(&blocked)
        .join("upper/etc/ssl/certs/ca-certificates.crt");
    assert!(
        std::fs::read_to_string(&copied).ok().as_deref() == Some(image_roots.as_str()),
        "{} does not hold the image's roots",
        copied.display()
    );
    let with_secret = sh_ok(&daemon, &id, read).await;
    let (roots, ca) = with_secret
        .split_once("# sandboxd secrets broker CA\n")
        .unwrap_or_else(|| panic!("no broker CA in {with_secret}"));
    assert_eq!(roots, image_roots, "the image's roots, then the CA");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    assert!(!image_roots.contains("sandboxd secrets broker CA"));
    for sandbox in [&id, &blocked] {
        let mode = "stat -c '%u %a' /etc/ssl/certs/ca-certificates.crt";
        assert_eq!(sh_ok(&daemon, sandbox, mode).await.trim(), "0 644");
    }
    assert_eq!(
        daemon
            .metric("sandboxd_pool_claims_total{runtime=\"container\",image=\"python\",result=\"hit\"} ")
            .await,
        2.0
    );
    // The first claim reached its supervisor through the mailbox, not as
    // a request: what the assertions above saw in force came that way. The
    // second (the default policy, blocked) changed nothing it holds.
    assert_eq!(
        daemon
            .metric("sandboxd_pool_hand_overs_total{via=\"mailbox\"} ")
            .await,
        1.0
    );
    assert_eq!(
        daemon
            .metric("sandboxd_pool_hand_overs_total{via=\"request\"} ")
            .await,
        0.0
    );

    // More memory than the pooled sandboxes have: cold.
    daemon.pool_reaches(2).await;
    let big = daemon.create(json!({"memory_mib": 1024})).await;
    assert!(created_detail(&mut events, &big).await.is_null());
    assert_eq!(
        daemon
            .metric("sandboxd_pool_claims_total{runtime=\"container\",image=\"python\",result=\"unfit\"} ")
            .await,
        1.0
    );
    assert_eq!(daemon.pool_reaches(2).await["sandboxes"], 3);
    for id in [id, blocked, big] {
        daemon.delete(&id).await;
    }
}
