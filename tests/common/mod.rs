//! Test harness: starts a real `sandboxd` as root with its own state, run
//! dir, socket and btrfs pool (the image cache is shared, so images are built
//! once per machine), waits for its systemd-style READY notification, and
//! talks HTTP to it over the Unix socket. Dropping the daemon deletes every
//! sandbox it made and unmounts its pool.

#![allow(dead_code)]

pub mod cgroup;
pub mod linux_vm;
pub mod mounts;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::UnixStream;

pub const DAEMON: &str = env!("CARGO_BIN_EXE_sandboxd");
pub const CTL: &str = env!("CARGO_BIN_EXE_sandboxctl");

/// A shell script that keeps CPU 0 busy for `seconds` with one spin loop
/// and exits 0, for tests that measure how weights share CPU time. One
/// CPU, where the scheduler divides time by weight: spread over several,
/// where it places the loops (which tests running beside it shift) takes
/// a part in the split.
pub fn busy_on_cpu_0(seconds: u32) -> String {
    format!("exec taskset -c 0 sh -c 'timeout {seconds} sh -c \"while :; do :; done\"; exit 0'")
}

/// Field `field` of host process `pid`'s `/proc/PID/stat`, numbered as
/// in proc(5) (3: the state, 6: the session, 19: the nice value; from 3
/// on: the command name before it may hold spaces); `None` once the
/// process is gone.
pub fn proc_stat_field(pid: i32, field: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm
        .split_whitespace()
        .nth(field.checked_sub(3)?)
        .map(String::from)
}

/// Shared image cache: `SANDBOXD_TEST_IMAGES_DIR` or the daemon's default.
pub fn images_dir() -> PathBuf {
    std::env::var_os("SANDBOXD_TEST_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/sandboxd/images"))
}

/// The static agent that scripts/build-agent.sh put beside this build's
/// target folder (which CI may keep outside the clone).
pub fn agent_path() -> PathBuf {
    let target = Path::new(DAEMON)
        .parent()
        .and_then(Path::parent)
        .expect("daemon binary inside a target folder");
    target.join("x86_64-unknown-linux-gnu/release/sandbox-agent")
}

// Not every test crate that includes this module skips.
#[allow(unused_imports)]
pub use sandboxd_test_support::{note_skip, skip, Reason};

/// The `vmm` built beside the daemon (`cargo build --bins`).
pub fn vmm_path() -> PathBuf {
    Path::new(DAEMON).parent().expect("target dir").join("vmm")
}

/// Why these tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<(Reason, String)> {
    if !sandboxd_test_support::running_as_root() {
        return Some((
            Reason::NotRoot,
            "integration tests need root (namespaces, cgroups, mounts)".into(),
        ));
    }
    if !agent_path().exists() {
        return Some((
            Reason::NoAgent,
            format!(
                "static agent missing at {}; run scripts/build-agent.sh",
                agent_path().display()
            ),
        ));
    }
    None
}

/// Skips the calling test (see sandboxd_test_support::skip!) when the host
/// cannot run it.
#[macro_export]
macro_rules! require_host {
    () => {
        if let Some((reason, why)) = common::skip_reason() {
            common::skip!(reason, "{why}");
        }
    };
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

pub struct Exec {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub process: Value,
}

impl Exec {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    pub fn exit_code(&self) -> Option<i64> {
        self.process["exit_code"].as_i64()
    }
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// Starts a daemon with extra flags and waits until it says READY=1.
    pub fn start_with(flags: &[&str]) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("sandboxd-test-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let socket = dir.path().join("api.sock");
        let mut daemon = Daemon {
            socket,
            child: None,
            extra: flags.iter().map(|s| s.to_string()).collect(),
            dir,
        };
        daemon.spawn();
        daemon
    }

    /// The harness's flags, less those `extra` gives itself (a flag may
    /// appear only once), then `extra`.
    fn args(&self) -> Vec<String> {
        let d = self.dir.path();
        let defaults: Vec<String> = vec![
            "--state-dir".into(),
            d.join("state").display().to_string(),
            "--run-dir".into(),
            d.join("run").display().to_string(),
            "--socket".into(),
            self.socket.display().to_string(),
            "--images-dir".into(),
            images_dir().display().to_string(),
            "--agent-path".into(),
            agent_path().display().to_string(),
            "--disk-pool-gib".into(),
            "64".into(),
            "--cgroup-parent".into(),
            self.cgroup_parent(),
        ];
        let mut args: Vec<String> = defaults
            .chunks(2)
            .filter(|pair| !self.extra.contains(&pair[0]))
            .flatten()
            .cloned()
            .collect();
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Runs a daemon with extra flags that must refuse to start, and returns
    /// its exit status and what it wrote. Panics if it became ready instead,
    /// or had not exited after a minute.
    pub fn refused_start(flags: &[&str]) -> (std::process::ExitStatus, String) {
        let dir = tempfile::Builder::new()
            .prefix("sandboxd-test-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let daemon = Daemon {
            socket: dir.path().join("api.sock"),
            child: None,
            extra: flags.iter().map(|s| s.to_string()).collect(),
            dir,
        };
        let notify_path = daemon.dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
        let child = Command::new(DAEMON)
            .args(daemon.args())
            .env("NOTIFY_SOCKET", &notify_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sandboxd");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        // A daemon that starts says READY=1; a refused one exits.
        notify
            .set_nonblocking(true)
            .expect("non-blocking notify socket");
        let output = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(output) => output.expect("wait for sandboxd"),
            Err(_) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                panic!("sandboxd had not exited a minute after its start: did it start although it should have refused?");
            }
        };
        let mut buf = [0u8; 256];
        if let Ok(n) = notify.recv(&mut buf) {
            assert!(
                !buf[..n].starts_with(b"READY=1"),
                "sandboxd became ready although it should have refused to start"
            );
        }
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status, text)
    }

    fn spawn(&mut self) {
        let notify_path = self.dir.path().join("notify.sock");
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
        notify
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .expect("log");
        let child = Command::new(DAEMON)
            .args(self.args())
            .env("NOTIFY_SOCKET", &notify_path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start sandboxd");
        self.child = Some(child);
        let mut buf = [0u8; 256];
        loop {
            match notify.recv(&mut buf) {
                Ok(n) if buf[..n].starts_with(b"READY=1") => break,
                Ok(_) => continue,
                Err(e) => panic!("sandboxd did not become ready: {e}\n{}", self.log()),
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read(self.dir.path().join("daemon.log"))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// This daemon's own cgroup parent, so concurrent test daemons never
    /// see (or sweep) each other's sandboxes.
    pub fn cgroup_parent(&self) -> String {
        let name = self
            .dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("/{name}")
    }

    /// Its `--run-dir`: the harness's, or one its extra flags give.
    pub fn run_dir(&self) -> PathBuf {
        self.extra
            .iter()
            .position(|flag| flag == "--run-dir")
            .and_then(|at| self.extra.get(at + 1))
            .map(PathBuf::from)
            .unwrap_or_else(|| self.dir.path().join("run"))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Kills the daemon with `signal` (sandboxes must survive) and waits for it.
    pub fn kill(&mut self, signal: nix::sys::signal::Signal) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
            let _ = child.wait();
        }
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> i32 {
        let child = self.child.as_ref().expect("the daemon is running");
        child.id() as i32
    }

    /// Sends the running daemon `signal` without waiting for anything.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the daemon is running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
            .expect("signal sandboxd");
    }

    /// Polls the daemon's log until a line holds `needle` (a log line is
    /// the only sign some changes give); returns that line.
    pub async fn await_log(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the daemon's log never said {needle:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends the daemon `signal` and awaits its exit; `None` when it was
    /// not running.
    pub fn stop(&mut self, signal: nix::sys::signal::Signal) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        Some(child.wait().expect("wait for sandboxd"))
    }

    /// Starts the daemon again on the same state (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill(nix::sys::signal::Signal::SIGTERM);
        self.spawn();
    }

    pub async fn raw(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        http(&self.socket, method, path, body)
            .await
            .unwrap_or_else(|| panic!("request {path} to sandboxd failed\n{}", self.log()))
    }

    /// Pids of this daemon's waiting standby supervisors (`supervise
    /// --standby`, started ahead of creates): their stdin is still the
    /// daemon's pipe (a handed one reads /dev/null).
    pub fn standby_pids(&self) -> Vec<i32> {
        let run = self.run_dir().display().to_string();
        processes_where(|pid, args| is_waiting_standby(pid, args, &run))
    }

    /// The sandboxes' run directories under `<run>/sandboxes` (what a
    /// removed sandbox must not leave), not the daemon's own entries there.
    pub fn sandbox_run_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.run_dir().join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !is_daemons_run_entry(name))
            .collect()
    }

    /// The sandbox seccomp program this daemon shares with its supervisors
    /// (`<run>/sandboxes/.seccomp-<digest>.bpf`), each file there.
    pub fn shared_seccomp_programs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.run_dir().join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".seccomp-"))
            .map(|e| e.path())
            .collect()
    }

    /// This daemon's ready network slots (`<run>/sandboxes/.slot-N`),
    /// namespaces made ahead of creates (not those still being made,
    /// `.slot-N.making`).
    pub fn slot_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.run_dir().join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(".slot-") && !name.ends_with(".making"))
            .collect()
    }

    /// Waits until the daemon has made at least `slots` network slots and
    /// `standbys` standby supervisors (made in the background, with no
    /// event for it), with a bounded deadline.
    pub async fn made_ahead(&self, slots: usize, standbys: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.slot_dirs().len() < slots || self.standby_pids().len() < standbys {
            assert!(
                std::time::Instant::now() < deadline,
                "made ahead: {:?} slots, {:?} standbys",
                self.slot_dirs(),
                self.standby_pids()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The pool fills in the background and the API has no event for
    /// that (a pooled sandbox is invisible until handed out), so this polls
    /// `/v1/health` until `pooled` reaches `want`, with a bounded deadline.
    pub async fn pool_reaches(&self, want: u64) -> Value {
        self.pool_reaches_within(want, Duration::from_secs(60))
            .await
    }

    /// [`Self::pool_reaches`] with a deadline of `within`.
    pub async fn pool_reaches_within(&self, want: u64, within: Duration) -> Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let (_, health) = self.call(Method::GET, "/v1/health", None).await;
            if health["pooled"] == want {
                return health;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pool never reached {want}: {health}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The sample of `/metrics` whose line starts with `line_start` (name,
    /// labels, space), 0 when absent.
    pub async fn metric(&self, line_start: &str) -> f64 {
        let (_, metrics) = self.raw(Method::GET, "/metrics", Vec::new()).await;
        String::from_utf8_lossy(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix(line_start))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// Reads `/metrics` until the sample whose line starts with
    /// `line_start` (name, labels, space) is above zero: the daemon samples
    /// its proxies every few seconds (and on each scrape).
    pub async fn await_metric(&self, line_start: &str) -> f64 {
        self.await_metric_within(line_start, Duration::from_secs(30))
            .await
    }

    /// [`Self::await_metric`] allowing `within`.
    pub async fn await_metric_within(&self, line_start: &str, within: Duration) -> f64 {
        let deadline = std::time::Instant::now() + within;
        loop {
            let value = self.metric(line_start).await;
            if value > 0.0 {
                return value;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {line_start} above zero in /metrics"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The sandbox's egress log (`GET .../network/log`), oldest first.
    pub async fn egress_log(&self, id: &str) -> Vec<Value> {
        let (status, log) = self
            .call(
                Method::GET,
                &format!("/v1/sandboxes/{id}/network/log"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{log}");
        log["entries"].as_array().expect("entries").clone()
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let (status, bytes) = self.raw(method, path, body).await;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, value)
    }

    /// Takes a snapshot of `kind` (`memory` or `filesystem`) of sandbox
    /// `id` (asserting 201) and returns its id.
    pub async fn snapshot(&self, id: &str, kind: &str) -> String {
        let (status, snap) = self
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(json!({ "kind": kind })),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{snap}\n{}", self.log());
        snap["id"].as_str().expect("snapshot id").to_string()
    }

    /// Creates a sandbox (asserting 201) and returns its id.
    pub async fn create(&self, body: Value) -> String {
        let (status, value) = self.call(Method::POST, "/v1/sandboxes", Some(body)).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "create failed: {value}\n{}",
            self.log()
        );
        value["id"].as_str().expect("id").to_string()
    }

    /// The caller's sandboxes (`GET /v1/sandboxes`, asserting 200, so an
    /// error never reads as "none").
    pub async fn sandboxes(&self) -> Vec<Value> {
        let (status, list) = self.call(Method::GET, "/v1/sandboxes", None).await;
        assert_eq!(status, StatusCode::OK, "list failed: {list}");
        list["sandboxes"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("no sandboxes array in {list}"))
    }

    pub async fn delete(&self, id: &str) {
        let (status, value) = self
            .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "delete failed: {value}");
    }

    /// Starts a process from `body` and returns its id.
    pub async fn start_process(&self, id: &str, body: Value) -> u64 {
        let (status, value) = self
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "start failed: {value}");
        value["id"].as_u64().expect("process id")
    }

    /// Asks for process `body` in sandbox `id`, which the API must refuse
    /// (400) with `code`; returns the error's message.
    pub async fn refused_process(&self, id: &str, body: Value, code: &str) -> String {
        let (status, answer) = self
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Reads a process's output stream to its end.
    pub async fn output(&self, id: &str, proc: u64) -> Exec {
        let (status, bytes) = self
            .raw(
                Method::GET,
                &format!("/v1/sandboxes/{id}/processes/{proc}/output"),
                Vec::new(),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut exec = Exec {
            stdout: Vec::new(),
            stderr: Vec::new(),
            process: Value::Null,
        };
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let event: Value = serde_json::from_slice(line).expect("ndjson line");
            match event["type"].as_str() {
                Some("stdout") => exec.stdout.extend(
                    b64.decode(event["data"].as_str().unwrap_or(""))
                        .expect("b64"),
                ),
                Some("stderr") => exec.stderr.extend(
                    b64.decode(event["data"].as_str().unwrap_or(""))
                        .expect("b64"),
                ),
                Some("exit") => exec.process = event["process"].clone(),
                _ => {}
            }
        }
        exec
    }

    /// Runs argv to completion and returns its output and final state.
    /// Writes `data` to a process's stdin (asserting 204).
    pub async fn write_stdin(&self, id: &str, proc: u64, data: &[u8]) {
        let path = format!("/v1/sandboxes/{id}/processes/{proc}/stdin");
        let (status, body) = self.raw(Method::POST, &path, data.to_vec()).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{path}: {body:?}");
    }

    /// Closes a process's stdin (asserting 204).
    pub async fn close_stdin(&self, id: &str, proc: u64) {
        let path = format!("/v1/sandboxes/{id}/processes/{proc}/stdin");
        let (status, body) = self.raw(Method::DELETE, &path, Vec::new()).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{path}: {body:?}");
    }

    pub async fn exec(&self, id: &str, argv: &[&str]) -> Exec {
        let proc = self.start_process(id, json!({ "argv": argv })).await;
        self.output(id, proc).await
    }

    /// Exposes `port` of sandbox `id` through the ingress with no token
    /// (asserting 201).
    pub async fn expose_public(&self, id: &str, port: u16) {
        let (status, answer) = self
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/ports"),
                Some(serde_json::json!({"port": port, "auth": "none"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }

    pub async fn sh(&self, id: &str, script: &str) -> Exec {
        self.exec(id, &["sh", "-c", script]).await
    }
}

/// Whether `name`, an entry of `<run>/sandboxes`, is the daemon's own
/// rather than a sandbox's: a network slot made ahead (`.slot-N`) or the
/// seccomp program it shares with its supervisors (`.seccomp-*`).
pub fn is_daemons_run_entry(name: &str) -> bool {
    name.starts_with(".slot-") || name.starts_with(".seccomp-")
}

/// Prints the end of each sandbox's logs under daemon run directory
/// `run_dir`, for a failed test: each sandbox's supervisor logs to its own
/// file; a microVM's VMM to another, and its guest kernel says what
/// happened inside it (an OOM kill, a panic) only on its serial console.
/// Whatever tears the sandboxes down first (containerd's shims, at a CRI
/// test's failure) calls it too, as the files go with them.
pub fn print_sandbox_logs(run_dir: &Path) {
    let sandboxes = run_dir.join("sandboxes");
    let names = std::fs::read_dir(&sandboxes)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|name| !is_daemons_run_entry(&name.to_string_lossy()));
    for name in names {
        for log in ["shim.log", "vm/vmm.log", "vm/console.log"] {
            let path = sandboxes.join(&name).join(log);
            if let Ok(bytes) = std::fs::read(&path) {
                eprintln!(
                    "--- the end of {} ---\n{}",
                    path.display(),
                    last_lines(&String::from_utf8_lossy(&bytes), FAILURE_LOG_LINES)
                );
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test shows what the daemon was doing: a hang or a flake
        // in CI leaves nothing else to read once its temp dir is gone.
        if std::thread::panicking() {
            eprintln!(
                "--- the end of this test's sandboxd log ---\n{}",
                last_lines(&self.log(), FAILURE_LOG_LINES)
            );
            print_sandbox_logs(&self.run_dir());
        }
        // Delete what the test left, through the daemon (the real teardown path).
        let socket = self.socket.clone();
        if self.child.is_some() {
            let cleanup = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                runtime.block_on(async {
                    let probe = Daemon::probe(&socket).await?;
                    for id in probe {
                        let _ = Daemon::raw_delete(&socket, &id).await;
                    }
                    Some(())
                })
            });
            let _ = cleanup.join();
        }
        self.kill(nix::sys::signal::Signal::SIGTERM);
        // This daemon's cgroup parent (and its supervisors group) go too;
        // rmdir only removes empty groups, so anything leaked stays visible.
        let parent = self.cgroup_parent();
        for hierarchy in cgroup::hierarchies() {
            let dir = cgroup::daemon_group(&hierarchy, &parent);
            let _ = std::fs::remove_dir(dir.join("supervisors"));
            let _ = std::fs::remove_dir(&dir);
        }
        let pool = self.state_dir().join("disk");
        let _ = nix::mount::umount2(&pool, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Runs `ip ARGS` (test plumbing: namespaces, links), failing the caller
/// with its message.
pub fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How much of a daemon's (or containerd's) log a failed test prints.
pub const FAILURE_LOG_LINES: usize = 200;

/// The last `n` lines of `text`.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A busybox tree at `<dir>/busybox`, built by the image recipe as root:
/// owned by host uid 0, as containerd's snapshots are.
pub fn root_owned_busybox(dir: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let tree = dir.join("busybox");
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("rootfs/images/busybox.sh");
    let out = std::process::Command::new("bash")
        .arg(&recipe)
        .arg(&tree)
        .output()
        .expect("run the busybox recipe");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let owner = std::fs::metadata(tree.join("bin/busybox")).map(|m| m.uid());
    assert_eq!(owner.ok(), Some(0), "{}", tree.display());
    tree
}

/// Pids of the host's processes whose (pid, command-line arguments) pass
/// `wanted`.
/// Whether process `pid`, run with `args`, is a standby supervisor of the
/// daemon whose run directory is `run`, still waiting for a sandbox (its
/// stdin is the daemon's pipe until it is handed one).
pub fn is_waiting_standby(pid: i32, args: &[&str], run: &str) -> bool {
    let waiting = std::fs::read_link(format!("/proc/{pid}/fd/0"))
        .is_ok_and(|l| l.to_string_lossy().starts_with("pipe:"));
    waiting && args.contains(&"--standby") && args.iter().any(|a| a.starts_with(run))
}

pub fn processes_where(wanted: impl Fn(i32, &[&str]) -> bool) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            let args: Vec<&str> = cmdline.split('\0').collect();
            wanted(pid, &args)
        })
        .collect()
}

/// One HTTP request on a fresh connection to the API socket.
pub async fn http(
    socket: &Path,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Option<(StatusCode, Vec<u8>)> {
    let stream = UnixStream::connect(socket).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sandboxd")
        .body(Full::new(Bytes::from(body)))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, bytes.to_vec()))
}

impl Daemon {
    async fn probe(socket: &Path) -> Option<Vec<String>> {
        let (_, bytes) = http(socket, Method::GET, "/v1/sandboxes", Vec::new()).await?;
        let list: Value = serde_json::from_slice(&bytes).ok()?;
        Some(
            list["sandboxes"]
                .as_array()?
                .iter()
                .filter_map(|s| s["id"].as_str().map(String::from))
                .collect(),
        )
    }

    async fn raw_delete(socket: &Path, id: &str) -> Option<()> {
        http(
            socket,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Vec::new(),
        )
        .await?;
        Some(())
    }
}

// ---------------------------------------------------------------------------
// Helpers shared by the themed integration tests (processes, limits, files,
// security, concurrency): host-side process views (cgroups themselves are
// read through `cgroup`) and streaming file transfers.
// ---------------------------------------------------------------------------

/// Host pids in the per-process cgroup of sandbox process `proc` (empty when
/// the group is gone).
pub fn process_host_pids(id: &str, proc: u64) -> Vec<i32> {
    cgroup::procs_in(&cgroup::sandbox_dir("pids", id).join(format!("p{proc}")))
}

/// Percent-encodes a value for a query string.
pub fn query_escape(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

type ChunkStream = futures::stream::BoxStream<
    'static,
    Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
>;

impl Daemon {
    /// `PUT /v1/sandboxes/{id}/files?path=PATH` with a body streamed from
    /// `chunks`, so large uploads never sit in memory. `None` when the
    /// connection failed before a response came.
    pub async fn upload_stream<I>(
        &self,
        id: &str,
        path: &str,
        chunks: I,
    ) -> Option<(StatusCode, Value)>
    where
        I: Iterator<Item = Vec<u8>> + Send + 'static,
    {
        use futures::StreamExt;
        let stream = UnixStream::connect(&self.socket).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake::<
            _,
            http_body_util::StreamBody<ChunkStream>,
        >(TokioIo::new(stream))
        .await
        .ok()?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body: ChunkStream = futures::stream::iter(chunks)
            .map(|c| Ok(hyper::body::Frame::data(Bytes::from(c))))
            .boxed();
        let request = Request::builder()
            .method(Method::PUT)
            .uri(format!(
                "/v1/sandboxes/{id}/files?path={}",
                query_escape(path)
            ))
            .header("host", "sandboxd")
            .body(http_body_util::StreamBody::new(body))
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let status = response.status();
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Some((status, value))
    }

    /// `GET /v1/sandboxes/{id}/files?path=PATH`, handing each body chunk to
    /// `sink` as it arrives. Returns the status and the bytes received.
    pub async fn download_with(
        &self,
        id: &str,
        path: &str,
        mut sink: impl FnMut(&[u8]),
    ) -> (StatusCode, u64) {
        let stream = UnixStream::connect(&self.socket).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::builder()
            .method(Method::GET)
            .uri(format!(
                "/v1/sandboxes/{id}/files?path={}",
                query_escape(path)
            ))
            .header("host", "sandboxd")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let mut response = sender.send_request(request).await.expect("download");
        let status = response.status();
        let mut total = 0u64;
        while let Some(frame) = response.body_mut().frame().await {
            let frame = frame.expect("download body");
            if let Some(data) = frame.data_ref() {
                total += data.len() as u64;
                sink(data);
            }
        }
        (status, total)
    }
}

/// The JSON values of a whole NDJSON body.
pub fn ndjson_lines(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("an NDJSON line"))
        .collect()
}

impl Daemon {
    /// `POST /v1/images` of `image` (a reference or a spec): pulled or
    /// built ahead; the status and the answer.
    pub async fn ready_image(&self, image: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/v1/images", Some(json!({ "image": image })))
            .await
    }

    /// The same with `?progress=true`: every line of the stream.
    pub async fn ready_image_lines(&self, image: Value) -> Vec<Value> {
        let body = json!({ "image": image }).to_string().into_bytes();
        let (status, lines) = self
            .raw(Method::POST, "/v1/images?progress=true", body)
            .await;
        assert_eq!(status, StatusCode::OK);
        ndjson_lines(&lines)
    }
}

/// A followed NDJSON stream (events, process output), read line by line.
pub struct NdjsonStream {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl NdjsonStream {
    /// Next event, or `None` when the stream ended or `timeout` passed.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).expect("an NDJSON line"));
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(data) = frame.ok()?.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// Reads until an event matches, returning everything read.
    pub async fn until(&mut self, timeout: Duration, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(event) = self.next(timeout).await {
            let stop = done(&event);
            seen.push(event);
            if stop {
                return seen;
            }
        }
        panic!("stream ended before the awaited event; saw {seen:?}");
    }
}

impl Daemon {
    /// Follows `GET /v1/events` from `cursor`.
    pub async fn follow_events(&self, cursor: u64) -> NdjsonStream {
        self.follow(&format!("/v1/events?cursor={cursor}")).await
    }

    /// Follows a process's output (`.../processes/{proc}/output`): its
    /// stdout and stderr events, then its exit.
    pub async fn follow_output(&self, id: &str, proc: u64) -> NdjsonStream {
        self.follow(&format!("/v1/sandboxes/{id}/processes/{proc}/output"))
            .await
    }

    /// Opens a streaming GET (asserting 200) and reads it line by line.
    pub async fn follow(&self, path: &str) -> NdjsonStream {
        let stream = UnixStream::connect(&self.socket).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::builder()
            .uri(path)
            .header("host", "sandboxd")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = sender.send_request(request).await.expect("send");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        NdjsonStream {
            body: response.into_body(),
            buf: Vec::new(),
        }
    }
}

/// Why memory snapshots cannot be tested here, if they cannot.
pub fn criu_missing() -> Option<String> {
    let criu = ["/usr/local/sbin/criu", "/usr/sbin/criu"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let out = std::process::Command::new(criu)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text.split_whitespace().nth(1).unwrap_or("0");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    ((major, minor) < (4, 2)).then(|| {
        format!("{criu} is {version}; memory snapshots need CRIU 4.2+ (scripts/install-criu.sh)")
    })
}

/// One HTTP/1.1 request for `/` to `host` through the ingress at `addr`,
/// on a connection it closes after the answer; the whole answer.
pub async fn ingress_get(addr: std::net::SocketAddr, host: &str, wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer = tokio::time::timeout(wait, async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    })
    .await;
    match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("GET / (Host: {host}): {e}"),
        Err(_) => panic!("GET / (Host: {host}): no answer in {wait:?}"),
    }
}

/// A loopback address with a port free now (for a daemon's listener).
pub fn free_loopback_addr() -> std::net::SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().expect("its address")
}
