//! Create -> ready, create -> output of `python3 -c 'print(1)'` and create
//! -> output of run-code `print(1)` (Python) through a real sandboxd (cold;
//! from the warm pool as is; from the pool with a request's own egress
//! policy, env, labels, TTL, lower limits, and a secret), beside `runc run`
//! and `crun run` of the same command in the same image and `crun run
//! /bin/true`, all in one run. A pooled sandbox's run-code forks its warm
//! interpreter; a command naming `python3` is always a fresh exec. Prints
//! medians and ratios and writes the raw samples to
//! `benches/results/create_latency.json`.
//!
//!     sudo cargo bench --bench create_latency            # BENCH_RUNS=50 by default
//!
//! `BENCH_CREATE_GAP_MS=N` waits N ms before each measured create, as a
//! caller creating one sandbox now and then does: the daemon's work made
//! ahead of creates (network slots, standby supervisors) then runs between
//! them rather than beside the next one.
//!
//! crun 1.8 refuses this hybrid cgroup host while a cgroup2 mount is visible,
//! so the whole benchmark (daemon, runc, crun) runs in a private mount
//! namespace without `/sys/fs/cgroup/unified`: same conditions for everyone.

mod peers;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::UnixStream;

use peers::{median, oci_bundle, private_mount_namespace, python_rootfs, IMAGES};

const DAEMON: &str = env!("CARGO_BIN_EXE_sandboxd");

fn agent() -> PathBuf {
    Path::new(DAEMON)
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("x86_64-unknown-linux-gnu/release/sandbox-agent"))
        .unwrap_or_default()
}

async fn http(socket: &Path, method: Method, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let stream = UnixStream::connect(socket).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sandboxd")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("send");
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, bytes.to_vec())
}

struct Daemon {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Daemon {
    fn start(extra: &[&str]) -> Daemon {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let notify_path = dir.path().join("notify");
        let notify = UnixDatagram::bind(&notify_path).expect("notify");
        notify
            .set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let d = dir.path();
        let child = Command::new(DAEMON)
            .arg("--state-dir")
            .arg(d.join("state"))
            .arg("--run-dir")
            .arg(peers::daemon_run_dir(d))
            .arg("--socket")
            .arg(d.join("api.sock"))
            .arg("--images-dir")
            .arg(IMAGES)
            .arg("--agent-path")
            .arg(agent())
            .args(["--disk-pool-gib", "16", "--max-sandboxes", "1024"])
            .arg("--cgroup-parent")
            .arg(cgroup_parent())
            .args(extra)
            .env("NOTIFY_SOCKET", &notify_path)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start sandboxd");
        let mut buf = [0u8; 64];
        loop {
            let n = notify
                .recv(&mut buf)
                .expect("sandboxd did not become ready");
            if buf[..n].starts_with(b"READY=1") {
                break;
            }
        }
        Daemon { dir, child }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }
}

/// This run's own cgroup parent, removed when its daemon stops.
fn cgroup_parent() -> String {
    format!("/sandboxd-bench-{}", std::process::id())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: a clean stop tears the warm pool down.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = nix::mount::umount2(
            &self.dir.path().join("state/disk"),
            nix::mount::MntFlags::MNT_DETACH,
        );
        peers::remove_cgroup_parent(&cgroup_parent());
    }
}

async fn create(socket: &Path, body: &Value) -> String {
    let body = body.to_string().into_bytes();
    let (status, bytes) = http(socket, Method::POST, "/v1/sandboxes", body).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&bytes));
    let value: Value = serde_json::from_slice(&bytes).expect("json");
    value["id"].as_str().expect("id").to_string()
}

/// The command: a fresh `python3` exec.
fn exec_print() -> Value {
    json!({"argv": ["python3", "-c", "print(1)"]})
}

/// Run-code: a pooled sandbox's warm interpreter forks for it.
fn run_code_print() -> Value {
    json!({"code": "print(1)", "language": "python"})
}

async fn python_print(socket: &Path, id: &str, process: &Value) {
    let body = process.to_string().into_bytes();
    let (status, bytes) = http(
        socket,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        body,
    )
    .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&bytes));
    let proc: Value = serde_json::from_slice(&bytes).expect("json");
    let pid = proc["id"].as_u64().expect("process id");
    let (_, out) = http(
        socket,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes/{pid}/output"),
        Vec::new(),
    )
    .await;
    assert_eq!(stdout(&out), b"1\n", "{}", String::from_utf8_lossy(&out));
}

/// The stdout of an output stream (NDJSON events, base64 data); an
/// unbuffered interpreter writes `print`'s text and newline apart.
fn stdout(stream: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let mut out = Vec::new();
    for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let event: Value = serde_json::from_slice(line).expect("output event");
        if event["type"] == "stdout" {
            let data = event["data"].as_str().expect("data");
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .expect("base64"),
            );
        }
    }
    out
}

async fn delete(socket: &Path, id: &str) {
    let (status, _) = http(
        socket,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Vec::new(),
    )
    .await;
    assert_eq!(status, 204);
}

/// Waits until the daemon's warm pool holds `size` sandboxes (a bench-only
/// poll: the API has no event for it yet).
async fn pool_full(socket: &Path, size: u64) {
    for _ in 0..3000 {
        let (_, body) = http(socket, Method::GET, "/v1/health", Vec::new()).await;
        let health: Value = serde_json::from_slice(&body).expect("health");
        if health["pooled"].as_u64() == Some(size) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the warm pool did not refill within 30 s");
}

/// What a pool claim is asked for beyond the pooled defaults: an allow
/// list, env, labels, a TTL, lower limits and (when `secret`) a brokered
/// secret, each put in force at the claim.
fn custom_request(secret: bool) -> Value {
    let mut body = json!({
        "image": "python",
        "allow_list": ["pypi.org", "*.pythonhosted.org"],
        "env": {"BENCH": "1"},
        "labels": {"bench": "create_latency"},
        "ttl_seconds": 300,
        "cpu": 0.5,
        "memory_mib": 256,
        "pids": 128,
        "disk_mib": 1024,
    });
    if secret {
        body["secrets"] = json!(["BENCH_KEY"]);
    }
    body
}

/// The sum (s) and count of each phase of the daemon's container creates.
async fn phase_totals(socket: &Path) -> Vec<(String, f64, f64)> {
    let (_, metrics) = http(socket, Method::GET, "/metrics", Vec::new()).await;
    peers::phase_totals(&String::from_utf8_lossy(&metrics), "container")
}

/// One daemon's samples, each create asking for the same request.
struct Measured {
    ready: Vec<f64>,
    output: Vec<f64>,
    code_output: Vec<f64>,
    /// The mean of each create phase (ms) over the measured cold creates
    /// (a pool's claims record none).
    phases: Vec<(String, f64)>,
}

/// Create -> ready and create -> python output samples from one daemon,
/// each create asking for `body`.
async fn measure(runs: usize, flags: &[&str], pool: Option<u64>, body: &Value) -> Measured {
    let daemon = Daemon::start(flags);
    let socket = daemon.socket();
    let secret = json!({"name": "BENCH_KEY", "value": "bench-value", "hosts": ["api.example.com"]});
    let (status, _) = http(
        &socket,
        Method::POST,
        "/v1/secrets",
        secret.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 201);
    let (mut ready, mut output, mut code_output) = (Vec::new(), Vec::new(), Vec::new());
    // Warm-up: page cache, image lookup.
    let id = create(&socket, body).await;
    delete(&socket, &id).await;
    let gap = std::env::var("BENCH_CREATE_GAP_MS").ok().map(|ms| {
        Duration::from_millis(
            ms.parse()
                .unwrap_or_else(|_| panic!("BENCH_CREATE_GAP_MS={ms:?} is not a number of ms")),
        )
    });
    let phases_before = phase_totals(&socket).await;
    // Before each measured create: the pool full again, and the gap.
    let settle = || async {
        if let Some(size) = pool {
            pool_full(&socket, size).await;
        }
        if let Some(gap) = gap {
            tokio::time::sleep(gap).await;
        }
    };
    for _ in 0..runs {
        settle().await;
        let start = Instant::now();
        let id = create(&socket, body).await;
        ready.push(start.elapsed().as_secs_f64() * 1000.0);
        delete(&socket, &id).await;
        for (process, samples) in [
            (exec_print(), &mut output),
            (run_code_print(), &mut code_output),
        ] {
            settle().await;
            let start = Instant::now();
            let id = create(&socket, body).await;
            python_print(&socket, &id, &process).await;
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
            delete(&socket, &id).await;
        }
    }
    let phases = peers::phase_means(&phases_before, &phase_totals(&socket).await);
    Measured {
        ready,
        output,
        code_output,
        phases,
    }
}

/// `runtime run` of `bundle` as run `i`'s container ([`peers::time_runtime_run`]).
fn time_runtime(runtime: &str, bundle: &Path, i: usize, expect: &[u8]) -> f64 {
    let name = format!("bench-{runtime}-{}-{i}", std::process::id());
    peers::time_runtime_run(runtime, bundle, &name, expect)
}

fn main() {
    if !peers::should_run() {
        return;
    }
    let runs = peers::bench_runs(50);
    private_mount_namespace();
    // Built (where it is not) before `/run` is replaced: a host's
    // resolv.conf may point into it.
    let rootfs = python_rootfs(DAEMON);
    let run_tmpfs = peers::run_like_systemd();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A line per series: in the nested host (benches/nested.sh) a run
    // takes minutes, and a silent one counts as hung.
    let series = |what: &str, measured: Measured| {
        eprintln!("create_latency: {what} measured");
        measured
    };
    let plain = json!({"image": "python"});
    let cold = series("cold", runtime.block_on(measure(runs, &[], None, &plain)));
    let pool = ["--pool-size", "2"];
    let pooled = series(
        "pooled",
        runtime.block_on(measure(runs, &pool, Some(2), &plain)),
    );
    let custom = series(
        "pooled, custom",
        runtime.block_on(measure(runs, &pool, Some(2), &custom_request(false))),
    );
    let secret = series(
        "pooled, + secret",
        runtime.block_on(measure(runs, &pool, Some(2), &custom_request(true))),
    );
    let (ready, output, code) = (cold.ready, cold.output, cold.code_output);
    let (pooled_ready, pooled_output, pooled_code) =
        (pooled.ready, pooled.output, pooled.code_output);
    let (custom_ready, custom_output, custom_code) =
        (custom.ready, custom.output, custom.code_output);
    let (secret_ready, secret_output, secret_code) =
        (secret.ready, secret.output, secret.code_output);

    let scratch = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let bundle = oci_bundle(scratch.path(), &rootfs, &["python3", "-c", "print(1)"]);
    let true_dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let true_bundle = oci_bundle(true_dir.path(), &rootfs, &["/bin/true"]);
    let (mut runc, mut crun, mut crun_true) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        runc.push(time_runtime("runc", &bundle, i, b"1\n"));
        crun.push(time_runtime("crun", &bundle, i, b"1\n"));
        crun_true.push(time_runtime("crun", &true_bundle, i + runs, b""));
    }
    eprintln!("create_latency: runc and crun measured");

    let raw = json!({
        "runs": runs,
        "unit": "ms",
        "run_dir_tmpfs": run_tmpfs,
        "sandboxd_create_to_ready_cold": ready,
        "sandboxd_create_to_python_output_cold": output,
        "sandboxd_create_to_run_code_output_cold": code,
        "sandboxd_create_to_run_code_output_pooled": pooled_code,
        "sandboxd_create_to_run_code_output_pooled_custom": custom_code,
        "sandboxd_create_to_run_code_output_pooled_custom_secret": secret_code,
        "sandboxd_create_to_ready_pooled": pooled_ready,
        "sandboxd_create_to_python_output_pooled": pooled_output,
        "sandboxd_create_to_ready_pooled_custom": custom_ready,
        "sandboxd_create_to_python_output_pooled_custom": custom_output,
        "sandboxd_create_to_ready_pooled_custom_secret": secret_ready,
        "sandboxd_create_to_python_output_pooled_custom_secret": secret_output,
        "runc_run_python": runc,
        "crun_run_python": crun,
        "crun_run_true": crun_true,
        "sandboxd_cold_create_phase_means_ms": cold.phases,
    });
    let (m_ready, m_out) = (median(&ready), median(&output));
    let (p_ready, p_out) = (median(&pooled_ready), median(&pooled_output));
    let (c_ready, c_out) = (median(&custom_ready), median(&custom_output));
    let (s_ready, s_out) = (median(&secret_ready), median(&secret_output));
    let (m_runc, m_crun, m_true) = (median(&runc), median(&crun), median(&crun_true));
    let (m_code, p_code) = (median(&code), median(&pooled_code));
    let (c_code, s_code) = (median(&custom_code), median(&secret_code));
    println!("create_latency ({runs} runs each, medians in ms)");
    let run = if run_tmpfs { "a tmpfs" } else { "the host's" };
    println!("  (/run, the daemon's run directory and runc's and crun's state: {run}; BENCH_HOST_RUN=1 keeps the host's)");
    println!("  sandboxd create -> ready (cold)                  {m_ready:8.2}");
    println!("  sandboxd create -> python output (cold)          {m_out:8.2}");
    println!("  sandboxd create -> ready (pooled)                {p_ready:8.2}");
    println!("  sandboxd create -> python output (pooled)        {p_out:8.2}");
    println!("  sandboxd create -> ready (pooled, custom)        {c_ready:8.2}");
    println!("  sandboxd create -> python output (pooled, custom){c_out:8.2}");
    println!("  sandboxd create -> ready (pooled, + secret)      {s_ready:8.2}");
    println!("  sandboxd create -> python output (pooled, + secret){s_out:6.2}");
    println!("  sandboxd create -> run-code output (cold)        {m_code:8.2}");
    println!("  sandboxd create -> run-code output (pooled)      {p_code:8.2}");
    println!("  sandboxd create -> run-code output (pooled, custom){c_code:6.2}");
    println!("  sandboxd create -> run-code output (pooled, + secret){s_code:4.2}");
    println!("  runc run python3 -c 'print(1)'                   {m_runc:8.2}");
    println!("  crun run python3 -c 'print(1)'                   {m_crun:8.2}");
    println!("  crun run /bin/true                               {m_true:8.2}");
    for (what, ratio) in [
        ("output / crun (cold)", m_out / m_crun),
        ("output / crun (pooled)", p_out / m_crun),
        ("run-code output / crun (cold)", m_code / m_crun),
        ("run-code output / crun (pooled)", p_code / m_crun),
        ("run-code output / crun (pooled, custom)", c_code / m_crun),
        ("output / runc (cold)", m_out / m_runc),
        ("ready (cold) / crun /bin/true", m_ready / m_true),
        ("ready pooled / ready cold", p_ready / m_ready),
        ("ready pooled custom / ready cold", c_ready / m_ready),
        ("ready pooled + secret / ready cold", s_ready / m_ready),
    ] {
        println!("  ratio {what:<40} {ratio:8.3}");
    }
    println!("  cold create phases (means in ms, sandboxd_create_phase_seconds):");
    for (phase, ms) in &cold.phases {
        println!("    {phase:<12} {ms:8.2}");
    }
    let file = peers::write_results("create_latency", &raw);
    println!("  raw samples: {}", file.display());
}
