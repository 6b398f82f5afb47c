//! MicroVM sandboxes through a real sandboxd: create -> ready (the guest's
//! agent has dialled in and said Hello), create -> the output of a process,
//! memory snapshot, and fork -> ready, with the freestanding test guest as
//! the kernel (what this kvm_pvm host can run). A container create -> ready
//! runs in the same daemon for scale. Prints medians and writes the raw
//! samples to `benches/results/microvm.json`.
//!
//!     sudo cargo bench --bench microvm        # BENCH_RUNS=30 by default
//!
//! The VMM alone (process start -> first serial line, beside QEMU microvm)
//! is `cargo bench -p vmm --bench boot`; its snapshots with 256 MiB touched
//! are `cargo bench -p vmm --bench vm_snapshot`.

#[path = "../tests/common/mod.rs"]
mod common;
mod peers;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::Daemon;
use hyper::{Method, StatusCode};
use peers::median;
use serde_json::{json, Value};

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// The test guest, built with the repository's script into `dir`.
fn test_guest(dir: &Path) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vmm/guest/build.sh");
    let built = std::process::Command::new("sh")
        .arg(script)
        .arg(dir)
        .output()
        .ok()?;
    built.status.success().then(|| dir.join("test-guest.elf"))
}

struct Samples {
    create_ready: Vec<f64>,
    create_output: Vec<f64>,
    container_ready: Vec<f64>,
    snapshot: Vec<f64>,
    fork_ready: Vec<f64>,
}

async fn measure(daemon: &Daemon, runs: usize) -> Samples {
    let vm = json!({"runtime": "vm", "image": "busybox", "memory_mib": 64});
    // Warm-up: the image's ext4 export and the agent disk are made once.
    let id = daemon.create(vm.clone()).await;
    daemon.delete(&id).await;
    let mut s = Samples {
        create_ready: Vec::new(),
        create_output: Vec::new(),
        container_ready: Vec::new(),
        snapshot: Vec::new(),
        fork_ready: Vec::new(),
    };
    for _ in 0..runs {
        let begun = Instant::now();
        let id = daemon.create(vm.clone()).await;
        s.create_ready.push(ms(begun));
        let run = daemon.exec(&id, &["echo", "hi"]).await;
        s.create_output.push(ms(begun));
        assert_eq!(run.out(), "hi\n");
        daemon.delete(&id).await;

        let begun = Instant::now();
        let id = daemon.create(json!({"image": "busybox"})).await;
        s.container_ready.push(ms(begun));
        daemon.delete(&id).await;
    }
    let source = daemon.create(vm.clone()).await;
    for _ in 0..3 {
        daemon.exec(&source, &["count"]).await;
    }
    let mut snapshots = Vec::new();
    for _ in 0..runs.min(10) {
        let begun = Instant::now();
        let (status, snap): (StatusCode, Value) = daemon
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{source}/snapshots"),
                Some(json!({"kind": "memory"})),
            )
            .await;
        s.snapshot.push(ms(begun));
        assert_eq!(status, StatusCode::CREATED, "{snap}");
        snapshots.push(snap["id"].as_str().expect("id").to_string());
    }
    let snap = snapshots[0].clone();
    for _ in 0..runs {
        let begun = Instant::now();
        let fork = daemon.create(json!({"from_snapshot": snap})).await;
        s.fork_ready.push(ms(begun));
        assert_eq!(daemon.exec(&fork, &["count"]).await.out(), "count=4\n");
        daemon.delete(&fork).await;
    }
    // Where the time goes: the daemon's create phases, summed over every
    // create above (VMs, containers and forks together).
    let (_, metrics) = daemon.raw(Method::GET, "/metrics", Vec::new()).await;
    for line in String::from_utf8_lossy(&metrics)
        .lines()
        .filter(|l| l.starts_with("sandboxd_create_phase_seconds_sum"))
    {
        eprintln!("  {line}");
    }
    daemon.delete(&source).await;
    for snap in snapshots {
        let _ = daemon
            .call(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
            .await;
    }
    s
}

fn main() {
    if let Some((_, why)) = common::skip_reason() {
        println!("microvm benchmark skipped: {why}");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // The vmm is another package's binary: cargo bench does not build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "-p", "vmm", "--bin", "vmm"])
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("microvm benchmark skipped: cargo build --release -p vmm failed");
        return;
    }
    let vmm = Path::new(common::DAEMON)
        .parent()
        .map(|d| d.join("vmm"))
        .unwrap_or_default();
    let guest_dir = tempfile::tempdir().expect("tempdir");
    let Some(guest) = test_guest(guest_dir.path()).filter(|_| vmm.is_file()) else {
        println!("microvm benchmark skipped: no vmm binary or test guest (gcc) here");
        return;
    };
    let runs = peers::bench_runs(30);
    let daemon = Daemon::start_with(&[
        "--vm-kernel",
        &guest.display().to_string(),
        "--vmm-path",
        &vmm.display().to_string(),
    ]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let s = runtime.block_on(measure(&daemon, runs));

    let medians = json!({
        "vm_create_to_ready_ms": median(&s.create_ready),
        "vm_create_to_output_ms": median(&s.create_output),
        "container_create_to_ready_ms": median(&s.container_ready),
        "vm_snapshot_ms": median(&s.snapshot),
        "vm_fork_to_ready_ms": median(&s.fork_ready),
    });
    println!("microVM sandboxes, test guest, 64 MiB ({runs} runs, medians in ms)");
    println!(
        "  VM create -> ready            {:8.1}",
        median(&s.create_ready)
    );
    println!(
        "  VM create -> echo output      {:8.1}",
        median(&s.create_output)
    );
    println!(
        "  container create -> ready     {:8.1}",
        median(&s.container_ready)
    );
    println!(
        "  VM memory snapshot            {:8.1}",
        median(&s.snapshot)
    );
    println!(
        "  VM fork -> ready              {:8.1}",
        median(&s.fork_ready)
    );
    let raw = json!({
        "runs": runs,
        "unit": "ms",
        "vm_create_to_ready": s.create_ready,
        "vm_create_to_output": s.create_output,
        "container_create_to_ready": s.container_ready,
        "vm_snapshot": s.snapshot,
        "vm_fork_to_ready": s.fork_ready,
        "medians": medians,
    });
    peers::write_results("microvm", &raw);
}
