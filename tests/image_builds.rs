//! Root-only: declarative images (`image: {...spec}`) built in a build
//! sandbox from a package index and an apt repository this test serves
//! itself in the egress tests' server namespace (a wheel it writes with
//! Python's zipfile, a .deb it packs with dpkg-deb and indexes with
//! apt-ftparchive), with the daemon pointed at them.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use common::Daemon;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use upstream::{Upstream, SERVER_IPS};

const PORT: u16 = 8080;
const WHEEL: &str = "sbdtestpkg-1.0-py3-none-any.whl";
const DEB: &str = "sbd-test-tool_1.0_all.deb";

/// A static file server for the package sources, counting what is fetched.
struct Packages {
    /// Kept for the server's lifetime.
    _root: tempfile::TempDir,
    fetched: Arc<Mutex<HashMap<String, usize>>>,
}

impl Packages {
    fn host() -> &'static str {
        SERVER_IPS[1]
    }

    fn start(upstream: &Upstream) -> Packages {
        let root = tempfile::tempdir().expect("tempdir");
        make_index(root.path());
        make_apt_repo(root.path());
        let listener = sandboxd::net::plumbing::in_netns(&upstream.server_netns(), || {
            TcpListener::bind((Self::host(), PORT))
        })
        .expect("enter the server namespace")
        .expect("bind the package server");
        let fetched: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (dir, seen) = (root.path().to_path_buf(), Arc::clone(&fetched));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (dir, seen) = (dir.clone(), Arc::clone(&seen));
                std::thread::spawn(move || serve(stream, &dir, &seen));
            }
        });
        Packages {
            _root: root,
            fetched,
        }
    }

    fn flags(&self) -> Vec<String> {
        vec![
            "--pip-index-url".into(),
            format!("http://{}:{PORT}/simple", Self::host()),
            "--apt-sources".into(),
            format!("deb [trusted=yes] http://{}:{PORT}/apt ./", Self::host()),
        ]
    }

    fn times_fetched(&self, file: &str) -> usize {
        let fetched = self.fetched.lock().expect("fetched");
        fetched
            .iter()
            .filter(|(path, _)| path.ends_with(file))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Serves one connection: GET of a file under `dir` (an `index.html` for
/// a directory), 404 otherwise; one request per connection.
fn serve(stream: std::net::TcpStream, dir: &Path, seen: &Mutex<HashMap<String, usize>>) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => break,
            Ok(_) if header.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split(['?', '#'])
        .next()
        .unwrap_or("/")
        .to_string();
    *seen.lock().expect("seen").entry(path.clone()).or_default() += 1;
    let mut file = dir.join(path.trim_start_matches('/'));
    if file.is_dir() {
        file = file.join("index.html");
    }
    let safe = !path.contains("..");
    let mut stream = reader.into_inner();
    let (status, body) = match std::fs::read(&file) {
        Ok(body) if safe => ("200 OK", body),
        _ => ("404 Not Found", b"not here".to_vec()),
    };
    // pip reads an index page only when it says it is HTML.
    let kind = if file.extension().is_some_and(|e| e == "html") {
        "text/html"
    } else {
        "application/octet-stream"
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `simple/sbdtestpkg/index.html` linking a wheel written with zipfile.
fn make_index(root: &Path) {
    let files = root.join("files");
    let project = root.join("simple").join("sbdtestpkg");
    std::fs::create_dir_all(&files).expect("files dir");
    std::fs::create_dir_all(&project).expect("index dir");
    let script = r#"
import base64, hashlib, sys, zipfile
path = sys.argv[1]
files = {
    "sbdtestpkg/__init__.py": 'VALUE = "from the local index"\n',
    "sbdtestpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: sbdtestpkg\nVersion: 1.0\n",
    "sbdtestpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: sandboxd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(path, "w") as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("sbdtestpkg-1.0.dist-info/RECORD,,")
    z.writestr("sbdtestpkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
print(hashlib.sha256(open(path, "rb").read()).hexdigest())
"#;
    let wheel = files.join(WHEEL);
    let sha = run(Command::new("python3").arg("-c").arg(script).arg(&wheel));
    std::fs::write(
        project.join("index.html"),
        format!(
            "<!DOCTYPE html><html><body><a href=\"/files/{WHEEL}#sha256={}\">{WHEEL}</a></body></html>\n",
            sha.trim()
        ),
    )
    .expect("project page");
}

/// `apt/` holding one .deb (a script in /usr/bin) and its Packages and
/// Release, a flat repository (`deb [trusted=yes] URL ./`).
fn make_apt_repo(root: &Path) {
    let pkg = tempfile::tempdir().expect("tempdir");
    let control = pkg.path().join("DEBIAN");
    let bin = pkg.path().join("usr/bin");
    std::fs::create_dir_all(&control).expect("DEBIAN");
    std::fs::create_dir_all(&bin).expect("usr/bin");
    std::fs::write(
        control.join("control"),
        "Package: sbd-test-tool\nVersion: 1.0\nArchitecture: all\nMaintainer: sandboxd tests <tests@sandboxd.invalid>\nDescription: a tool from the test's apt repository\n",
    )
    .expect("control");
    let tool = bin.join("sbd-test-tool");
    std::fs::write(&tool, "#!/bin/sh\necho from the local apt repository\n").expect("tool");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let repo = root.join("apt");
    std::fs::create_dir_all(&repo).expect("apt dir");
    run(Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(pkg.path())
        .arg(repo.join(DEB)));
    let packages = run(Command::new("apt-ftparchive")
        .args(["packages", "."])
        .current_dir(&repo));
    std::fs::write(repo.join("Packages"), packages).expect("Packages");
    let release = run(Command::new("apt-ftparchive")
        .args(["release", "."])
        .current_dir(&repo));
    std::fs::write(repo.join("Release"), release).expect("Release");
}

fn daemon(upstream: &Upstream, packages: &Packages) -> Daemon {
    let mut flags = upstream.daemon_flags();
    flags.extend(packages.flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Daemon::start_with(&flags)
}

/// The spec of the main test: both package kinds, commands, env, workdir.
fn full_spec() -> Value {
    json!({
        "python_version": "python3.11",
        "python_packages": ["sbdtestpkg==1.0"],
        "system_packages": ["sbd-test-tool"],
        "commands": ["echo built > /opt/marker", "pwd > /opt/built-in"],
        "env": {"GREETING": "hello from the spec"},
        "workdir": "/workspace"
    })
}

fn builds_started(daemon: &Daemon) -> usize {
    daemon.log().matches("building an image").count()
}

fn pool_partials(daemon: &Daemon) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![daemon.state_dir()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".partial-") {
                found.push(entry.path());
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) && found.len() < 100 {
                // Only the pool's own folders, not sandbox roots.
                if dir == daemon.state_dir() || name == "built" || name.starts_with("pool") {
                    stack.push(entry.path());
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spec_builds_once_for_concurrent_creates_and_its_packages_work() {
    require_host!();
    let upstream = Upstream::start();
    let packages = Packages::start(&upstream);
    let daemon = daemon(&upstream, &packages);
    let creates = (0..10).map(|_| {
        daemon.call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "image": full_spec() })),
        )
    });
    let answers = futures::future::join_all(creates).await;
    let mut ids = Vec::new();
    let mut digests = Vec::new();
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::CREATED, "{body}\n{}", daemon.log());
        ids.push(body["id"].as_str().expect("id").to_string());
        digests.push(body["image_digest"].as_str().expect("digest").to_string());
    }
    assert!(digests.iter().all(|d| d == &digests[0]), "{digests:?}");
    assert_eq!(builds_started(&daemon), 1, "ten creates, one build");
    assert_eq!(
        packages.times_fetched(WHEEL),
        1,
        "the wheel was fetched once"
    );
    assert_eq!(packages.times_fetched(DEB), 1, "the .deb was fetched once");

    let id = &ids[0];
    let run = daemon
        .sh(
            id,
            "python3 -c 'import sbdtestpkg; print(sbdtestpkg.VALUE)'; sbd-test-tool; \
             cat /opt/marker /opt/built-in; pwd; echo \"$GREETING\"",
        )
        .await;
    assert_eq!(run.exit_code(), Some(0), "{}", run.err());
    assert_eq!(
        run.out(),
        "from the local index\nfrom the local apt repository\nbuilt\n/workspace\n/workspace\nhello from the spec\n"
    );

    // The create says it waited for a build, before it was ready.
    let (_, events) = daemon
        .raw(Method::GET, "/v1/events?follow=false", Vec::new())
        .await;
    let events = common::ndjson_lines(&events);
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["sandbox_id"] == json!(id))
        .filter_map(|e| e["kind"].as_str())
        .filter(|kind| *kind != "process_exited")
        .collect();
    assert_eq!(
        kinds,
        ["image_building", "image_built", "created", "ready"],
        "{events:?}"
    );

    // The image is listed, and the build sandbox is gone.
    let (_, images) = daemon.call(Method::GET, "/v1/images", None).await;
    let built = images["built"].as_array().expect("built");
    assert_eq!(built.len(), 1, "{images}");
    assert_eq!(built[0]["digest"], json!(digests[0]));
    assert!(built[0]["size_bytes"].as_u64().unwrap_or(0) > 0, "{images}");
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    let sandboxes = list["sandboxes"].as_array().expect("sandboxes");
    assert_eq!(sandboxes.len(), 10, "only the ten creates: {list}");
    assert!(pool_partials(&daemon).is_empty());

    // Another create finds it built: no build, nothing fetched.
    let again = daemon.create(json!({ "image": full_spec() })).await;
    assert_eq!(builds_started(&daemon), 1);
    assert_eq!(packages.times_fetched(WHEEL), 1);
    let run = daemon.sh(&again, "sbd-test-tool").await;
    assert_eq!(run.out(), "from the local apt repository\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_reaches_its_package_sources_and_nothing_else() {
    require_host!();
    let upstream = Upstream::start();
    let packages = Packages::start(&upstream);
    let daemon = daemon(&upstream, &packages);
    let fetch = |url: String| {
        format!("python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}', timeout=10).status)\"")
    };
    let index = format!("http://{}:{PORT}/simple/sbdtestpkg/", Packages::host());
    let elsewhere = format!("http://{}/", SERVER_IPS[0]);
    let create_fetching = |url: String| {
        let spec = json!({"python_packages": ["sbdtestpkg"], "commands": [fetch(url)]});
        daemon.call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "image": spec })),
        )
    };
    // Positive control: the index's host is reachable from a build.
    let (status, body) = create_fetching(index.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}\n{}", daemon.log());
    let user = body["id"].as_str().expect("id").to_string();
    // Another host is not, and the failed build says why and leaves nothing.
    let (status, body) = create_fetching(elsewhere.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "image_build_failed", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&elsewhere),
        "names the failed step: {message}"
    );
    assert!(
        message.contains("urllib/request.py"),
        "carries the log's tail: {message}"
    );
    let (_, images) = daemon.call(Method::GET, "/v1/images", None).await;
    assert_eq!(
        images["built"].as_array().map(Vec::len),
        Some(1),
        "only the first built: {images}"
    );
    assert!(pool_partials(&daemon).is_empty());
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "no build sandbox is left: {list}"
    );

    // Built ahead with progress: the log streams, then the image; a failed
    // build's stream ends with its error.
    let lines = daemon
        .ready_image_lines(json!({"base": "busybox", "commands": ["echo progress-marker"]}))
        .await;
    let log: String = lines
        .iter()
        .filter(|l| l["type"] == "log")
        .filter_map(|l| l["data"].as_str())
        .collect();
    assert!(
        log.contains("$ echo progress-marker\nprogress-marker\n"),
        "{lines:?}"
    );
    let done = lines.last().expect("a last line");
    assert_eq!(done["type"], "done", "{lines:?}");
    assert!(done["image"]["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("built-")));
    let lines = daemon
        .ready_image_lines(json!({"base": "busybox", "commands": ["echo doomed; exit 3"]}))
        .await;
    let last = lines.last().expect("a last line");
    assert_eq!(last["type"], "error", "{lines:?}");
    assert_eq!(last["error"]["code"], "image_build_failed", "{lines:?}");

    // A prune keeps the image a sandbox stacks, and removes it once none does.
    let name = images["built"][0]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let prune = || async {
        let (status, report) = daemon.call(Method::POST, "/v1/images/prune", None).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        report["removed"].as_array().cloned().unwrap_or_default()
    };
    assert!(!prune().await.contains(&json!(name)), "in use");
    daemon.delete(&user).await;
    assert!(prune().await.contains(&json!(name)), "unused");
    let (_, images) = daemon.call(Method::GET, "/v1/images", None).await;
    assert_eq!(images["built"], json!([]), "{images}");
}

#[tokio::test]
async fn specs_that_cannot_be_built_are_refused_with_what_to_write() {
    require_host!();
    let daemon = Daemon::start();
    let cases = [
        (json!({"python_version": "3.9"}), "3.11 (Debian bookworm)"),
        (
            json!({"base": "python", "python_version": "3.13"}),
            "comes with Debian trixie",
        ),
        (
            json!({"base": "busybox", "python_version": "3.11"}),
            "needs a Debian base",
        ),
        (
            json!({"base": "busybox", "system_packages": ["git"]}),
            "apt",
        ),
        (
            json!({"python_packages": ["--index-url=http://x"]}),
            "not an option",
        ),
        (json!({"pyhton_version": "3.11"}), "pyhton_version"),
        (json!({"workdir": "relative"}), "absolute"),
    ];
    for (spec, says) in cases {
        let (status, body) = daemon
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({ "image": spec })),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{spec}: {message}");
    }
    let (_, list) = daemon.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}
