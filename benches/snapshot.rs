//! Memory snapshot and fork of a container whose Python process holds
//! 100 MiB, through sandboxd, beside `runc checkpoint --leave-running` and
//! `runc restore` of the same Python process in the same image with the same
//! CRIU, in one run. Prints medians and writes the raw samples to
//! `benches/results/snapshot.json`.
//!
//!     sudo cargo bench --bench snapshot      # BENCH_RUNS=10 by default
//!
//! sandboxd's snapshot time is POST .../snapshots until 201 (freeze,
//! checkpoint, layer snapshot, thaw, SHA-256 of the images); fork -> ready
//! is POST /v1/sandboxes {from_snapshot} until 201 (image check, new
//! namespace and egress sockets, root, restore, agent answering). runc's
//! are the two commands' wall times.

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;
use hyper::{Method, StatusCode};
use peers::{median, oci_bundle, private_mount_namespace, python_rootfs, run_like_systemd};
use serde_json::{json, Value};

/// Touches 100 MiB, says so, and waits.
const HOLDER: &str = "import sys, time\n\
    data = bytearray(100 << 20)\n\
    for i in range(0, len(data), 4096): data[i] = 1\n\
    print('ready', flush=True)\n\
    while True: time.sleep(3600)";

/// CRIU as installed by scripts/install-criu.sh comes first for runc too.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn sandboxd(runs: usize) -> (Vec<f64>, Vec<f64>) {
    let run_dir = peers::run_dir_flags();
    let daemon = Daemon::start_with(&run_dir.iter().map(String::as_str).collect::<Vec<_>>());
    let source = daemon
        .create(json!({"image": "python", "memory_mib": 512}))
        .await;
    let holder = daemon
        .start_process(&source, json!({"argv": ["python3", "-c", HOLDER]}))
        .await;
    daemon
        .follow(&format!("/v1/sandboxes/{source}/processes/{holder}/output"))
        .await
        .until(Duration::from_secs(60), |e| e["type"] == "stdout")
        .await;
    let mut snapshot_ms = Vec::new();
    let mut fork_ms = Vec::new();
    for _ in 0..runs {
        let begun = Instant::now();
        let (status, snap): (StatusCode, Value) = daemon
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{source}/snapshots"),
                Some(json!({"kind": "memory"})),
            )
            .await;
        snapshot_ms.push(ms(begun));
        assert_eq!(status, StatusCode::CREATED, "{snap}");
        eprintln!("sandboxd snapshot {:.1} ms", ms(begun));
        let snap_id = snap["id"].as_str().expect("id").to_string();
        let begun = Instant::now();
        let fork = daemon.create(json!({"from_snapshot": snap_id})).await;
        fork_ms.push(ms(begun));
        eprintln!("sandboxd fork {:.1} ms", ms(begun));
        daemon.delete(&fork).await;
        let _ = daemon
            .call(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
            .await;
    }
    // Where a fork's time goes: the daemon's create phases (forks only
    // were created cold after the source).
    let (_, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    for line in String::from_utf8_lossy(&metrics)
        .lines()
        .filter(|l| l.starts_with("sandboxd_create_phase_seconds_sum"))
    {
        eprintln!("  {line}");
    }
    daemon.delete(&source).await;
    (snapshot_ms, fork_ms)
}

/// Runs runc with every stdio on /dev/null: a detached container keeps
/// runc's, and CRIU can only dump descriptors it can reach from inside the
/// container. runc's own errors go to `log`.
fn runc(args: &[&str], log: &Path) -> f64 {
    let begun = Instant::now();
    let status = Command::new("runc")
        .env("PATH", PATH)
        .arg("--log")
        .arg(log)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run runc");
    let took = ms(begun);
    assert!(
        status.success(),
        "runc {args:?}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    took
}

/// Resident memory of `pid` in KiB.
fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn runc_peer(runs: usize, rootfs: &Path) -> (Vec<f64>, Vec<f64>) {
    let scratch = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let bundle = oci_bundle(scratch.path(), rootfs, &["python3", "-c", HOLDER]);
    let bundle = bundle.display().to_string();
    let tag = std::process::id();
    let source = format!("bench-snap-{tag}");
    let pidfile = scratch.path().join("source.pid");
    let log = scratch.path().join("runc.log");
    runc(
        &[
            "run",
            "-d",
            "--pid-file",
            &pidfile.display().to_string(),
            "-b",
            &bundle,
            &source,
        ],
        &log,
    );
    let pid = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .to_string();
    // Its stdout is /dev/null: wait until the 100 MiB are resident.
    let deadline = Instant::now() + Duration::from_secs(60);
    while rss_kib(&pid) < 100 * 1024 {
        assert!(
            Instant::now() < deadline,
            "the runc holder never filled its memory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("runc holder ready");
    let mut checkpoint_ms = Vec::new();
    let mut restore_ms = Vec::new();
    for i in 0..runs {
        let images = scratch.path().join(format!("images-{i}"));
        let images = images.display().to_string();
        checkpoint_ms.push(runc(
            &[
                "checkpoint",
                "--leave-running",
                "--image-path",
                &images,
                &source,
            ],
            &log,
        ));
        let fork = format!("bench-fork-{tag}-{i}");
        restore_ms.push(runc(
            &[
                "restore",
                "-d",
                "--image-path",
                &images,
                "-b",
                &bundle,
                &fork,
            ],
            &log,
        ));
        let _ = Command::new("runc").args(["delete", "-f", &fork]).status();
    }
    let _ = Command::new("runc")
        .args(["delete", "-f", &source])
        .status();
    (checkpoint_ms, restore_ms)
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("snapshot benchmark skipped: {why}");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs = peers::bench_runs(10);
    private_mount_namespace();
    // Built (where it is not) before `/run` is replaced: a host's
    // resolv.conf may point into it.
    let rootfs = python_rootfs(common::DAEMON);
    let host_run = !run_like_systemd();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (snapshot_ms, fork_ms) = runtime.block_on(sandboxd(runs));
    let (checkpoint_ms, restore_ms) = runc_peer(runs, &rootfs);

    let medians = json!({
        "sandboxd_snapshot_ms": median(&snapshot_ms),
        "sandboxd_fork_to_ready_ms": median(&fork_ms),
        "runc_checkpoint_ms": median(&checkpoint_ms),
        "runc_restore_ms": median(&restore_ms),
    });
    println!("memory snapshot of a Python process holding 100 MiB ({runs} runs, medians in ms)");
    println!("  sandboxd snapshot        {:8.1}", median(&snapshot_ms));
    println!("  sandboxd fork -> ready   {:8.1}", median(&fork_ms));
    println!("  runc checkpoint          {:8.1}", median(&checkpoint_ms));
    println!("  runc restore             {:8.1}", median(&restore_ms));
    println!(
        "  fork / runc restore      {:8.2}",
        median(&fork_ms) / median(&restore_ms)
    );
    let run = if host_run { "the host's" } else { "a tmpfs" };
    println!("  (/run and the daemon's run directory: {run}; BENCH_HOST_RUN=1 keeps the host's)");
    let raw = json!({
        "runs": runs,
        "run_dir_tmpfs": !host_run,
        "unit": "ms",
        "sandboxd_snapshot": snapshot_ms,
        "sandboxd_fork_to_ready": fork_ms,
        "runc_checkpoint_leave_running": checkpoint_ms,
        "runc_restore": restore_ms,
        "medians": medians,
    });
    peers::write_results("snapshot", &raw);
}
